"""Run in a virtualenv with `polygate_celery[openai]` alone: one governed call through the
openai SDK adapter against a stub endpoint."""

from __future__ import annotations

import stub_provider

text = stub_provider.ask(
    {"base_url": stub_provider.serve(), "model": "stub", "adapter": "openai-sdk"}
)
assert text == stub_provider.REPLY, text
print(f"openai SDK adapter answered {text!r}")
