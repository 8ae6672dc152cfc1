"""The provider APIs the gateway speaks, and how each one's recorded request maps onto the one
internal conversation model (OpenAI chat messages + tools) that tokenization and reuse work on.

Every call records ``request`` exactly as received and ``response`` as the *internal* assistant
message (OpenAI chat shape: ``content``, ``tool_calls``, optional ``reasoning_content``). For reuse
after a restart, the gateway rebuilds each call's internal messages from its stored request with the
API's converter below, so no API needs extra columns in the store.

A converter takes the stored request body and returns ``(messages, tools)`` in internal form, or
raises ``HarnessRLError`` if it cannot. The converters are pure functions in modules that import no
call machinery (``responses_input``, ``anthropic_convert``), so this table imports them directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harnessrl.gateway.apis.anthropic_convert import request_to_internal as messages_request_to_internal
from harnessrl.gateway.apis.responses_input import request_to_internal as responses_request_to_internal

Converter = Callable[[dict[str, Any]], tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]


def chat_request_to_internal(
    request: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    return list(request["messages"]), request.get("tools") or None


#: api name (``Call.api``) -> its converter; ``completions`` has no conversation.
CONVERTERS: dict[str, Converter] = {
    "chat.completions": chat_request_to_internal,
    "responses": responses_request_to_internal,
    "messages": messages_request_to_internal,
}


def internal_conversation(
    api: str, request: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None] | None:
    """The internal ``(messages, tools)`` of a stored request, or ``None`` for APIs without a
    conversation (``completions``)."""
    converter = CONVERTERS.get(api)
    return None if converter is None else converter(request)
