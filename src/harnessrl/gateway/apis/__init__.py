"""The provider APIs the gateway speaks, and how each one's recorded request maps onto the one
internal conversation model (OpenAI chat messages + tools) that tokenization and reuse work on.

Every call records ``request`` exactly as received and ``response`` as the *internal* assistant
message (OpenAI chat shape: ``content``, ``tool_calls``, optional ``reasoning_content``). For reuse
after a restart, the gateway rebuilds each call's internal messages from its stored request with the
API's converter below, so no API needs extra columns in the store.

A converter takes the stored request body and returns ``(messages, tools)`` in internal form, or
raises ``HarnessRLError`` if it cannot. The converters are pure functions in modules that import no
call machinery (``responses_input``, ``anthropic_convert``), so this table imports them directly.

``template_context`` gives what else a stored request's prompt was rendered with: its internal
tools and template kwargs, exactly as the API's handler passed them to the template (each handler
takes them from the same functions), so reuse can tell whether a later call's prompt may continue
this one's tokens (``messages.template_key``) without normalizing the request's messages again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harnessrl.gateway.apis.anthropic_convert import convert_tools, thinking_kwargs
from harnessrl.gateway.apis.anthropic_convert import request_to_internal as messages_request_to_internal
from harnessrl.gateway.apis.responses_input import reasoning_kwargs
from harnessrl.gateway.apis.responses_input import request_to_internal as responses_request_to_internal
from harnessrl.gateway.apis.responses_tools import tools_to_internal

Converter = Callable[[dict[str, Any]], tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]
#: ``(tools, template kwargs)`` as the template got them; ``None`` for none.
TemplateContext = tuple[list[dict[str, Any]] | None, dict[str, Any] | None]


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


def chat_template_context(request: dict[str, Any]) -> TemplateContext:
    kwargs = request.get("chat_template_kwargs")
    return request.get("tools") or None, kwargs if isinstance(kwargs, dict) and kwargs else None


def messages_template_context(request: dict[str, Any]) -> TemplateContext:
    return convert_tools(request.get("tools")), thinking_kwargs(request.get("thinking")) or None


def responses_template_context(request: dict[str, Any]) -> TemplateContext:
    return tools_to_internal(request.get("tools")), reasoning_kwargs(request.get("reasoning")) or None


#: api name -> what its stored request's prompt was rendered with besides the messages.
TEMPLATE_CONTEXTS: dict[str, Callable[[dict[str, Any]], TemplateContext]] = {
    "chat.completions": chat_template_context,
    "responses": responses_template_context,
    "messages": messages_template_context,
}


def template_context(api: str, request: dict[str, Any]) -> TemplateContext:
    """The tools and template kwargs a stored request's prompt was rendered with (none for APIs
    without a conversation)."""
    reader = TEMPLATE_CONTEXTS.get(api)
    return (None, None) if reader is None else reader(request)


def internal_conversation(
    api: str, request: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None] | None:
    """The internal ``(messages, tools)`` of a stored request, or ``None`` for APIs without a
    conversation (``completions``)."""
    converter = CONVERTERS.get(api)
    return None if converter is None else converter(request)
