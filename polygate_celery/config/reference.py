"""Configuration: the reference table of every setting, generated from the models.

``python -m polygate_celery.config.reference`` prints it; the README carries a
copy that a test keeps equal to it. The range column shows each numeric
setting's bounds (inclusive; ``>``/``<`` exclusive), refused at load outside them.
"""

from __future__ import annotations

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from polygate_celery.config.models import (
    AimdConfig,
    BreakerConfig,
    DeferralConfig,
    QuotaConfig,
    ScopeConfig,
    ScopeSettings,
    SourceConfig,
    SourceSettings,
    StoreConfig,
)

TABLES: list[tuple[str, type[BaseModel], set[str]]] = [
    ("[store]", StoreConfig, set()),
    ("[deferral]", DeferralConfig, set()),
    ("[sources.NAME] (and [source_defaults])", SourceSettings, {"breaker", "aimd"}),
    ("[sources.NAME] only", SourceConfig, set(SourceSettings.model_fields)),
    ("[sources.NAME.breaker]", BreakerConfig, set()),
    ("[sources.NAME.aimd]", AimdConfig, set()),
    ("[quotas.NAME]", QuotaConfig, set()),
    ("[scopes.NAME] (and [scope_defaults])", ScopeSettings, set()),
    ("[scopes.NAME] only", ScopeConfig, set(ScopeSettings.model_fields)),
]


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"`{value}`" if isinstance(value, str) else str(value)


def _number(value: float) -> str:
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:g}"


def _range(info: FieldInfo) -> str:
    """The bounds of a numeric setting, as the reference shows them ("" for others)."""
    low = high = ""
    for bound in info.metadata:
        if isinstance(bound, annotated_types.Ge):
            low = _number(bound.ge)  # type: ignore[arg-type]
        elif isinstance(bound, annotated_types.Gt):
            low = f"> {_number(bound.gt)}"  # type: ignore[arg-type]
        elif isinstance(bound, annotated_types.Le):
            high = _number(bound.le)  # type: ignore[arg-type]
        elif isinstance(bound, annotated_types.Lt):
            high = f"< {_number(bound.lt)}"  # type: ignore[arg-type]
    if low and high:
        return f"{low} to {high}"
    return low or high


def reference() -> str:
    lines: list[str] = []
    for title, model, skip in TABLES:
        header = ["| setting | default | range | meaning |", "|---|---|---|---|"]
        lines += [f"**{title}**", "", *header]
        for name, info in model.model_fields.items():
            if name in skip:
                continue
            meaning = (info.description or "").replace("|", "\\|")
            lines.append(f"| `{name}` | {_default(info)} | {_range(info)} | {meaning} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(reference(), end="")
