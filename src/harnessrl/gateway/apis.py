"""The provider APIs the gateway speaks, and how each one's recorded request maps onto the one
internal conversation model (OpenAI chat messages + tools) that tokenization and reuse work on.

Every call records ``request`` exactly as received and ``response`` as the *internal* assistant
message (OpenAI chat shape: ``content``, ``tool_calls``, optional ``reasoning_content``). For reuse
after a restart, the gateway rebuilds each call's internal messages from its stored request with the
API's converter below, so no API needs extra columns in the store.

A converter takes the stored request body and returns ``(messages, tools)`` in internal form, or
raises ``HarnessRLError`` if it cannot. Converters are referenced by import path so this module does
not import every API module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

Converter = Callable[[dict[str, Any]], tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]

# api name (Call.api) -> "module:function"
CONVERTERS: dict[str, str] = {
    "chat.completions": "harnessrl.gateway.apis:chat_request_to_internal",
    "responses": "harnessrl.gateway.responses:request_to_internal",
    "messages": "harnessrl.gateway.anthropic:request_to_internal",
}


def chat_request_to_internal(
    request: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    return list(request["messages"]), request.get("tools") or None


def internal_conversation(
    api: str, request: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None] | None:
    """The internal ``(messages, tools)`` of a stored request, or ``None`` for APIs without a
    conversation (``completions``)."""
    target = CONVERTERS.get(api)
    if target is None:
        return None
    module, _, name = target.partition(":")
    converter: Converter = getattr(importlib.import_module(module), name)
    return converter(request)
