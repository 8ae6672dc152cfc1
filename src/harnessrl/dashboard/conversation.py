"""The conversation of a trace: what the policy was prompted with on a rollout's last call, then its
answer.

A request body is the harness's own (the gateway records it as sent, extra keys included), so
nothing here trusts its shape, and each provider API's body is read the way the gateway reads it
(``gateway.apis``: ``responses_input``, ``anthropic_convert``, the chat ``MessageIn``): a typed
item or block shows its typed fields only, each checked for its type, so an extra key (a
``function_call`` item's added ``content``, a Messages message's ``tool_calls``) can neither hide
what the policy saw nor show what it never saw. An item of a type not known here is shown whole,
as JSON. A body that still cannot be rendered is shown as the raw request JSON, escaped, so one odd
call never fails the whole page. (The dashboard cannot call the gateway's converters: the gateway's
entry point imports the dashboard.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from harnessrl.dashboard.html import badge, esc, pretty_json
from harnessrl.schemas import Call

#: Content part types that carry their text under ``text`` (chat, Responses and Anthropic parts).
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})


def _message(role: Any, parts: Sequence[str], extra_class: str = "") -> str:
    shown = role if isinstance(role, str) and role else "message"
    return (
        f'<div class="msg {esc(shown)} {extra_class}"><div class="role">{esc(shown)}</div>'
        f"{''.join(parts)}</div>"
    )


def _pre(text: Any) -> str:
    """A string as preformatted text; anything else as escaped JSON."""
    return f"<pre>{esc(text)}</pre>" if isinstance(text, str) else pretty_json(text)


def _content(content: Any) -> str:
    """Message content: a string, a list of text parts (a bare string part too), else JSON."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(_text_part(part) for part in content)
    return _pre(content)


def _text_part(part: Any) -> str:
    if isinstance(part, str):
        return _pre(part)
    if isinstance(part, dict) and part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str):
        return _pre(part["text"])
    if isinstance(part, dict) and part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
        return f"<div>{badge('refusal')}{_pre(part['refusal'])}</div>"
    return pretty_json(part)  # not text: shown whole, so no key stands in for another


def _tool_call(name: Any, arguments: Any) -> str:
    return f"<div>{badge('tool call')} <b>{esc(name)}</b>{_pre(arguments)}</div>"


def _tool_result(output: Any) -> str:
    return f"<div>{badge('tool result')}{_content(output)}</div>"


def _reasoning(label: str, text: Any) -> str:
    """Reasoning, folded: a string, or a list of parts with a ``text`` each (Responses summaries)."""
    if not text:
        return ""
    if isinstance(text, list):
        shown = "".join(
            _pre(part["text"])
            if isinstance(part, dict) and isinstance(part.get("text"), str)
            else pretty_json(part)
            for part in text
        )
    else:
        shown = _pre(text)
    return f"<details><summary>{esc(label)}</summary>{shown}</details>"


# -- chat (OpenAI) messages: also the shape of every stored answer -------------------------------------


def _chat_tool_call(tool_call: Any) -> str:
    function = tool_call.get("function") if isinstance(tool_call, dict) else None
    if not isinstance(function, dict):
        return f"<div>{badge('tool call')}{pretty_json(tool_call)}</div>"
    return _tool_call(function.get("name"), function.get("arguments"))


def message_html(message: Any, extra_class: str = "") -> str:
    """One chat message (what ``MessageIn`` reads): role, content, tool calls, reasoning."""
    if not isinstance(message, dict):
        return _message(None, [pretty_json(message)], extra_class)
    parts = [_content(message.get("content"))]
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, list):
        parts += [_chat_tool_call(tool_call) for tool_call in tool_calls]
    elif tool_calls is not None:
        parts.append(f"<div>{badge('tool calls')}{pretty_json(tool_calls)}</div>")
    parts.append(_reasoning("reasoning_content", message.get("reasoning_content")))
    return _message(message.get("role"), parts, extra_class)


def _chat_html(request: dict[str, Any]) -> str:
    return "".join(message_html(m) for m in _listed(request.get("messages")))


# -- Responses input items ------------------------------------------------------------------------------


def _responses_item(item: Any) -> str:
    """One Responses input item by its type (``responses_input.input_to_messages``)."""
    if not isinstance(item, dict):
        return _message(None, [pretty_json(item)])
    kind = item.get("type") or ("message" if "role" in item else None)
    if kind == "message":
        return _message(item.get("role"), [_content(item.get("content"))])
    if kind == "function_call":
        return _message("assistant", [_tool_call(item.get("name"), item.get("arguments"))])
    if kind == "function_call_output":
        return _message("tool", [_tool_result(item.get("output"))])
    if kind == "reasoning":
        text = item.get("content") or item.get("summary") or item.get("encrypted_content")
        return _message("assistant", [_reasoning("reasoning", text)])
    return _message(kind if isinstance(kind, str) else None, [pretty_json(item)])


def _responses_html(request: dict[str, Any]) -> str:
    instructions, input_ = request.get("instructions"), request.get("input")
    parts = (
        [_message("system", [_pre(instructions)])] if isinstance(instructions, str) and instructions else []
    )
    if isinstance(instructions, list):
        parts += [_responses_item(item) for item in instructions]
    # The earlier conversation a ``previous_response_id`` resolved to, which the gateway recorded in
    # chat shape (``responses_input.PREVIOUS_KEY``).
    parts += [message_html(m) for m in _listed(request.get("_harnessrl_previous_messages"))]
    if isinstance(input_, str):
        parts.append(_message("user", [_pre(input_)]))
    else:
        parts += [_responses_item(item) for item in _listed(input_)]
    return "".join(parts)


# -- Anthropic Messages ---------------------------------------------------------------------------------


def _anthropic_block(block: Any) -> str:
    """One content block by its type (``anthropic_convert``)."""
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text" and isinstance(block.get("text"), str):
        return _pre(block["text"])
    if kind in ("tool_use", "server_tool_use"):
        return _tool_call(block.get("name"), block.get("input"))
    if kind == "tool_result":
        return _tool_result(block.get("content"))
    if kind == "thinking":
        return _reasoning("thinking", block.get("thinking"))
    return pretty_json(block)


def _anthropic_html(request: dict[str, Any]) -> str:
    system = request.get("system")
    parts = [_message("system", [_anthropic_content(system)])] if system else []
    for message in _listed(request.get("messages")):
        if isinstance(message, dict):
            parts.append(_message(message.get("role"), [_anthropic_content(message.get("content"))]))
        else:
            parts.append(_message(None, [pretty_json(message)]))
    return "".join(parts)


def _anthropic_content(content: Any) -> str:
    if isinstance(content, list):
        return "".join(_anthropic_block(block) for block in content)
    return _pre(content)


def _completions_html(request: dict[str, Any]) -> str:
    return _message("prompt", [_pre(request.get("prompt"))])


def _listed(value: Any) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")  # shown raw instead
    return value


#: ``Call.api`` -> how its request body is read.
_REQUESTS: dict[str, Callable[[dict[str, Any]], str]] = {
    "chat.completions": _chat_html,
    "responses": _responses_html,
    "messages": _anthropic_html,
    "completions": _completions_html,
}


def _rendered(call: Call) -> str:
    messages = _REQUESTS[call.api](call.request)
    return messages + (message_html(call.response, "answer") if call.response else "")


def conversation_html(calls: Sequence[Call]) -> str:
    """The last call's request (what the harness had built up) followed by the policy's answer."""
    if not calls:
        return '<p class="muted">No model calls recorded.</p>'
    last = calls[-1]
    note = f'<p class="muted">As the harness sent call {last.seq} ({esc(last.api)}), then the answer.</p>'
    try:
        return note + _rendered(last)
    except Exception:  # noqa: BLE001 - a harness wrote this body: show it raw rather than fail the page
        return (
            note + '<p class="muted">This request cannot be shown as a conversation; as sent:</p>'
            f"{pretty_json(last.request)}<h4>answer</h4>{pretty_json(last.response)}"
        )
