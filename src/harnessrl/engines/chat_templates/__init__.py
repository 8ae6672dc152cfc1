"""Chat templates harnessrl installs on models it builds or converts (the tiny model, SmolLM2, GGUF files).

One template for now: ChatML with Hermes/Qwen2.5-style tool calling. Its default system message (used
when a conversation has none) is a parameter, because converted models keep their original default.
"""

from __future__ import annotations

import json
from importlib import resources

_DEFAULT_LINE = "{%- set default_system_message = none %}"


def chatml_tools_template(default_system_message: str | None = None) -> str:
    """The ChatML+tools Jinja template, with ``default_system_message`` rendered when no system turn is given."""
    text = resources.files(__package__).joinpath("chatml_tools.jinja").read_text(encoding="utf-8")
    assert _DEFAULT_LINE in text, "chatml_tools.jinja lost its default-system-message line"
    if default_system_message is not None:
        # json.dumps gives a valid Jinja string literal (double quotes, backslash escapes).
        literal = json.dumps(default_system_message, ensure_ascii=False)
        text = text.replace(_DEFAULT_LINE, "{%- set default_system_message = " + literal + " %}")
    return text
