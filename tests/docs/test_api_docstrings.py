"""The public API's docstrings document every parameter, so the reference has its tables.

Parsed as the manual's build parses them (griffe, Google style): a parameter missing from
``Args:`` or one documented that the signature does not have fails here.
"""

from __future__ import annotations

import griffe
import pytest

DOCUMENTED = [
    "polygate_celery.Gateway",
    "polygate_celery.Gateway.call",
    "polygate_celery.Gateway.chat",
    "polygate_celery.Gateway.embed",
    "polygate_celery.Gateway.ocr",
    "polygate_celery.celery.governed",
    "polygate_celery.celery.configure_worker",
    "polygate_celery.load_config",
    "polygate_celery.parse_config",
    "polygate_celery.Source.send",
    "polygate_celery.testing.VirtualClock",
    "polygate_celery.testing.celery.governed_tasks",
    "polygate_celery.testing.simulator.SimulatedProvider",
    "polygate_celery.celery.AsyncGovernedCalls.chat",
]
ERRORS = [
    "AllSourcesExhausted",
    "SourceFatalError",
    "DeferralBudgetExceeded",
    "ConfigError",
    "GovernanceBackendError",
    "StoreUnreachable",
    "StoreReplyError",
]


@pytest.fixture(scope="module")
def package() -> griffe.Object:
    return griffe.load("polygate_celery", docstring_parser="google", resolve_aliases=True)


def _object(package: griffe.Object, path: str) -> griffe.Object:
    found = package[path.removeprefix("polygate_celery.")]
    return found.final_target if isinstance(found, griffe.Alias) else found


def _sections(obj: griffe.Object) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    for target in (obj, obj.members.get("__init__")) if obj.is_class else (obj,):
        if target is not None and target.docstring is not None:
            for section in target.docstring.parse("google"):
                names = [getattr(item, "name", "").lstrip("*") for item in section.value or []]
                sections.setdefault(section.kind.value, []).extend(
                    names if isinstance(section.value, list) else []
                )
    return sections


@pytest.mark.parametrize("path", DOCUMENTED)
def test_every_parameter_is_documented(package: griffe.Object, path: str) -> None:
    obj = _object(package, path)
    function = obj.members["__init__"] if obj.is_class else obj
    wanted = [p.name.lstrip("*") for p in function.parameters if p.name not in {"self", "cls"}]
    assert _sections(obj).get("parameters", []) == wanted


@pytest.mark.parametrize(
    "path",
    [p for p in DOCUMENTED if not p.endswith(("Gateway", "VirtualClock", "SimulatedProvider"))],
)
def test_each_function_says_what_it_returns(package: griffe.Object, path: str) -> None:
    sections = _sections(_object(package, path))
    assert "returns" in sections or "yields" in sections


@pytest.mark.parametrize("name", ERRORS)
def test_each_error_documents_its_attributes(package: griffe.Object, name: str) -> None:
    obj = _object(package, f"polygate_celery.{name}")
    attributes = _sections(obj).get("attributes", [])
    init = obj.all_members["__init__"]  # a subclass's may be its base's
    assert attributes == [p.name for p in init.parameters if p.name != "self"]
