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

Size: the gateway caps a request's text, not its JSON: numbers, nulls and items of types nobody
reads cost no text, and written as indented JSON each gains a line and its nesting's indentation
(a 1 MB body became a 43 MB page). So a value shown as JSON is cut at ``MAX_JSON_CHARS`` (and
loses its indentation past it), and a conversation is shown in at most ``MAX_CONVERSATION_CHARS``
characters: its first messages and its last ones, the rest counted; within one message, its list
of parts likewise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from harnessrl.dashboard.html import badge, esc, pretty_json
from harnessrl.schemas import Call

#: Content part types that carry their text under ``text`` (chat, Responses and Anthropic parts).
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
#: The most characters of JSON shown of one value that is not text (an item of a type not known
#: here, a tool call's input object, a body shown raw); past it the JSON is cut, and said so.
MAX_JSON_CHARS = 200_000
#: The most characters of HTML one conversation is shown in: its first messages (half of it) and its
#: last ones; the messages between are counted. A message's list of parts is cut at it too.
MAX_CONVERSATION_CHARS = 4_000_000

#: A message of the conversation, rendered when (and only if) it is shown.
Part = Callable[[], str]


def _json(value: Any) -> str:
    return pretty_json(value, limit=MAX_JSON_CHARS)


def _joined(render: Callable[[Any], str], items: Sequence[Any], limit: int = MAX_CONVERSATION_CHARS) -> str:
    """``render`` of each item, joined, until they pass ``limit`` characters; the rest counted."""
    out, size = [], 0
    for i, item in enumerate(items):
        html = render(item)
        size += len(html)
        if size > limit:
            left = len(items) - i
            return (
                "".join(out)
                + f'<p class="muted">… {left:,} more parts not shown (over {limit:,} characters)</p>'
            )
        out.append(html)
    return "".join(out)


def _within(parts: Sequence[Part], limit: int = MAX_CONVERSATION_CHARS) -> str:
    """The messages of ``parts`` in at most ``limit`` characters: all of them if they fit, else the
    first within half of it and the last within the rest, with a count of those left out between.
    Only messages that may be shown are rendered, so the work is bounded too."""
    rendered, size = [], 0
    for part in parts:
        html = part()
        rendered.append(html)
        size += len(html)
        if size > limit:
            break
    else:
        return "".join(rendered)
    head, used = [], 0
    for html in rendered:
        if used + len(html) > limit // 2:
            break
        head.append(html)
        used += len(html)
    tail, j = [], len(parts) - 1
    while j >= len(head):
        html = rendered[j] if j < len(rendered) else parts[j]()
        if used + len(html) > limit:
            break
        tail.append(html)
        used += len(html)
        j -= 1
    left = j + 1 - len(head)
    note = (
        f'<p class="muted conversation-cut">… {left:,} messages not shown: a conversation is shown in at '
        f"most {limit:,} characters, its first and its last messages.</p>"
    )
    return "".join(head) + note + "".join(reversed(tail))


def _message(role: Any, parts: Sequence[str], extra_class: str = "") -> str:
    shown = role if isinstance(role, str) and role else "message"
    return (
        f'<div class="msg {esc(shown)} {extra_class}"><div class="role">{esc(shown)}</div>'
        f"{''.join(parts)}</div>"
    )


def _pre(text: Any) -> str:
    """A string as preformatted text; anything else as escaped JSON."""
    return f"<pre>{esc(text)}</pre>" if isinstance(text, str) else _json(text)


def _content(content: Any) -> str:
    """Message content: a string, a list of text parts (a bare string part too), else JSON."""
    if content is None:
        return ""
    if isinstance(content, list):
        return _joined(_text_part, content)
    return _pre(content)


def _text_part(part: Any) -> str:
    if isinstance(part, str):
        return _pre(part)
    if isinstance(part, dict) and part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str):
        return _pre(part["text"])
    if isinstance(part, dict) and part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
        return f"<div>{badge('refusal')}{_pre(part['refusal'])}</div>"
    return _json(part)  # not text: shown whole, so no key stands in for another


def _tool_call(name: Any, arguments: Any) -> str:
    return f"<div>{badge('tool call')} <b>{esc(name)}</b>{_pre(arguments)}</div>"


def _tool_result(output: Any) -> str:
    return f"<div>{badge('tool result')}{_content(output)}</div>"


def _reasoning(label: str, text: Any) -> str:
    """Reasoning, folded: a string, or a list of parts with a ``text`` each (Responses summaries)."""
    if not text:
        return ""
    shown = _joined(_reasoning_part, text) if isinstance(text, list) else _pre(text)
    return f"<details><summary>{esc(label)}</summary>{shown}</details>"


def _reasoning_part(part: Any) -> str:
    return _pre(part["text"]) if isinstance(part, dict) and isinstance(part.get("text"), str) else _json(part)


# -- chat (OpenAI) messages: also the shape of every stored answer -------------------------------------


def _chat_tool_call(tool_call: Any) -> str:
    function = tool_call.get("function") if isinstance(tool_call, dict) else None
    if not isinstance(function, dict):
        return f"<div>{badge('tool call')}{_json(tool_call)}</div>"
    return _tool_call(function.get("name"), function.get("arguments"))


def message_html(message: Any, extra_class: str = "") -> str:
    """One chat message (what ``MessageIn`` reads): role, content, tool calls, reasoning."""
    if not isinstance(message, dict):
        return _message(None, [_json(message)], extra_class)
    parts = [_content(message.get("content"))]
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, list):
        parts.append(_joined(_chat_tool_call, tool_calls))
    elif tool_calls is not None:
        parts.append(f"<div>{badge('tool calls')}{_json(tool_calls)}</div>")
    parts.append(_reasoning("reasoning_content", message.get("reasoning_content")))
    return _message(message.get("role"), parts, extra_class)


def _chat_parts(request: dict[str, Any]) -> list[Part]:
    return [partial(message_html, m) for m in _listed(request.get("messages"))]


def _text_message(role: str, text: Any) -> str:
    return _message(role, [_pre(text)])


# -- Responses input items ------------------------------------------------------------------------------


def _responses_item(item: Any) -> str:
    """One Responses input item by its type (``responses_input.input_to_messages``)."""
    if not isinstance(item, dict):
        return _message(None, [_json(item)])
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
    return _message(kind if isinstance(kind, str) else None, [_json(item)])


def _responses_parts(request: dict[str, Any]) -> list[Part]:
    instructions, input_ = request.get("instructions"), request.get("input")
    parts: list[Part] = []
    if isinstance(instructions, str) and instructions:
        parts.append(partial(_text_message, "system", instructions))
    if isinstance(instructions, list):
        parts += [partial(_responses_item, item) for item in instructions]
    # The earlier conversation a ``previous_response_id`` resolved to, which the gateway recorded in
    # chat shape (``responses_input.PREVIOUS_KEY``).
    parts += [partial(message_html, m) for m in _listed(request.get("_harnessrl_previous_messages"))]
    if isinstance(input_, str):
        parts.append(partial(_text_message, "user", input_))
    else:
        parts += [partial(_responses_item, item) for item in _listed(input_)]
    return parts


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
    return _json(block)


def _anthropic_parts(request: dict[str, Any]) -> list[Part]:
    system = request.get("system")
    parts: list[Part] = [partial(_anthropic_message, {"role": "system", "content": system})] if system else []
    return parts + [partial(_anthropic_message, message) for message in _listed(request.get("messages"))]


def _anthropic_message(message: Any) -> str:
    if not isinstance(message, dict):
        return _message(None, [_json(message)])
    return _message(message.get("role"), [_anthropic_content(message.get("content"))])


def _anthropic_content(content: Any) -> str:
    if isinstance(content, list):
        return _joined(_anthropic_block, content)
    return _pre(content)


def _completions_parts(request: dict[str, Any]) -> list[Part]:
    return [partial(_text_message, "prompt", request.get("prompt"))]


def _listed(value: Any) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")  # shown raw instead
    return value


#: ``Call.api`` -> how its request body is read: its messages, each rendered when shown.
_REQUESTS: dict[str, Callable[[dict[str, Any]], list[Part]]] = {
    "chat.completions": _chat_parts,
    "responses": _responses_parts,
    "messages": _anthropic_parts,
    "completions": _completions_parts,
}


def _rendered(call: Call) -> str:
    messages = _within(_REQUESTS[call.api](call.request))
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
            f"{_json(last.request)}<h4>answer</h4>{_json(last.response)}"
        )
