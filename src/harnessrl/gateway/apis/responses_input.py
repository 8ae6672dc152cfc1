"""OpenAI Responses API requests -> the internal conversation (OpenAI chat messages + function tools).

Pure functions: ``request_to_internal`` is registered in ``apis.CONVERTERS`` so reuse can rebuild a
recorded ``responses`` call's messages from its stored request after a restart.

Mapping (one input item at a time, in order):

- ``instructions`` -> a leading ``system`` message; ``developer`` messages -> ``system``.
- ``message`` items (or bare ``{"role", "content"}``): content as a string or parts (``input_text``,
  ``output_text``, ``refusal``). Images, files and audio are refused (400): the policy reads text
  only, and silently dropping them would train on a conversation the harness never had.
- One assistant turn gathers, in output order, a ``reasoning`` item (-> ``reasoning_content``), an
  assistant message (-> ``content``) and the ``function_call`` items after it (-> ``tool_calls``,
  ``call_id`` as the id). That is the exact shape of one answer of this gateway, so a harness that
  re-sends its history item by item matches the recorded assistant message and its sampled tokens
  are reused.
- ``function_call_output`` -> a ``tool`` message with ``tool_call_id``.
- Items of hosted tools (``web_search_call``, ``local_shell_call``, MCP, custom tools...) are left
  out: they belong to tools this gateway never offers the policy. ``item_reference`` is refused:
  the gateway keeps no item store to resolve it from.
- ``tools``: function tools -> chat's function tools; a function tool's ``name`` must be a string,
  its ``description`` a string or null and its ``parameters`` an object or null (400 otherwise: the
  template renders them). ``reasoning.effort`` -> the template kwarg ``enable_thinking``
  (``reasoning_kwargs``), passed whether or not the template reads it, so the kwargs are a function
  of the request alone, as reuse needs them to be (``apis.template_context``).
- A request that used ``previous_response_id`` is recorded with the resolved earlier conversation
  under ``PREVIOUS_KEY`` (added by the handler), so this function alone rebuilds it.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from harnessrl.errors import BadRequest
from harnessrl.gateway.apis.responses_tools import HOSTED_ITEMS, tools_to_internal

#: Private key the handler adds to a recorded request: the internal messages ``previous_response_id``
#: resolved to (everything before this request's own input, minus the earlier instructions).
PREVIOUS_KEY = "_harnessrl_previous_messages"
#: Prefix of the ``encrypted_content`` this gateway puts on reasoning items (plain reasoning text,
#: base64): the policy's own reasoning is no secret, and a harness that only echoes
#: ``encrypted_content`` back (Codex with ``store: false``) still gets its reasoning matched.
ENCRYPTED_PREFIX = "hrl1:"

_TEXT_PARTS = ("input_text", "output_text", "text")
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def encode_reasoning(text: str) -> str:
    return ENCRYPTED_PREFIX + base64.b64encode(text.encode("utf-8")).decode("ascii")


def _decode_reasoning(value: Any) -> str | None:
    """The reasoning text of an ``encrypted_content`` this gateway made; ``None`` for anyone else's."""
    if not isinstance(value, str) or not value.startswith(ENCRYPTED_PREFIX):
        return None
    try:
        return base64.b64decode(value[len(ENCRYPTED_PREFIX) :], validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def _text(content: Any, where: str) -> str:
    """One string from Responses content: a string or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of content parts", param=where)
    pieces = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS or kind == "refusal":
            value = part.get("refusal" if kind == "refusal" else "text")
            if not isinstance(value, str):
                raise BadRequest(f"{where}.{j}: the part's text must be a string", param=f"{where}.{j}")
            pieces.append(value)
        else:
            shown = kind if kind is not None else type(part).__name__
            raise BadRequest(
                f"{where}.{j}: content part of type {shown!r} is not supported (this policy reads text only)",
                param=f"{where}.{j}",
            )
    return "".join(pieces)


def _reasoning_text(item: dict[str, Any]) -> str | None:
    """Reasoning content, else the summary, else our own ``encrypted_content``; ``None`` if none."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list):
            texts = [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
            if texts and any(t.strip() for t in texts):
                return "\n\n".join(texts)
    return _decode_reasoning(item.get("encrypted_content"))


class _Builder:
    """Folds input items into chat messages, merging one answer's items into one assistant message."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.turn: dict[str, Any] | None = None  # the assistant message being gathered

    def flush(self) -> None:
        if self.turn is not None:
            self.messages.append(self.turn)
            self.turn = None

    def add(self, message: dict[str, Any]) -> None:
        self.flush()
        self.messages.append(message)

    def reasoning(self, text: str) -> None:
        # A reasoning item joins the answer that is open: one answer's items may hold reasoning after
        # its text or calls (GLM-4.5's parser gives reasoning, message, function_call, reasoning).
        # Opening a new turn there put an empty assistant turn, never sampled, into the next prompt.
        # Answers are separated by the items between them (a tool output, a user message), which
        # flush the turn.
        if self.turn is None:
            self.turn = {"role": "assistant", "content": "", "reasoning_content": text}
            return
        before = self.turn.get("reasoning_content")
        self.turn["reasoning_content"] = f"{before}\n{text}" if before else text

    def assistant_text(self, text: str) -> None:
        # Text after this answer's function calls still belongs to it: harnesses replay output items
        # in the order they were streamed, and the message item may close after the calls (Codex).
        # Only a second text opens a new turn; tool outputs in between already flushed this one.
        if self.turn is not None and self.turn["content"]:
            self.flush()
        if self.turn is None:
            self.turn = {"role": "assistant", "content": ""}
        self.turn["content"] = text

    def function_call(self, call: dict[str, Any]) -> None:
        if self.turn is None:
            self.turn = {"role": "assistant", "content": ""}
        self.turn.setdefault("tool_calls", []).append(call)


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{where}.{key} is required and must be a non-empty string", param=f"{where}.{key}")
    return value


def input_to_messages(input_: Any, where: str = "input") -> list[dict[str, Any]]:
    """Chat messages for a Responses ``input`` (a string or a list of items)."""
    if input_ is None:
        return []
    if isinstance(input_, str):
        return [{"role": "user", "content": input_}]
    if not isinstance(input_, list):
        raise BadRequest(f"{where} must be a string or a list of items", param=where)
    out = _Builder()
    for i, item in enumerate(input_):
        at = f"{where}.{i}"
        if not isinstance(item, dict):
            raise BadRequest(f"{at} must be an object", param=at)
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind is not None and not isinstance(kind, str):
            raise BadRequest(f"{at}.type must be a string", param=f"{at}.type")
        if kind == "message":
            raw_role = item.get("role")
            role = _ROLES.get(raw_role) if isinstance(raw_role, str) else None
            if role is None:
                raise BadRequest(
                    f"{at}.role must be one of user, assistant, system, developer", param=f"{at}.role"
                )
            text = _text(item.get("content"), f"{at}.content")
            if role == "assistant":
                out.assistant_text(text)
            else:
                out.add({"role": role, "content": text})
        elif kind == "function_call":
            arguments = item.get("arguments", "{}")
            if not isinstance(arguments, str | dict):
                raise BadRequest(f"{at}.arguments must be a JSON string", param=f"{at}.arguments")
            name = _string(item, "name", at)
            call_id = _string(item, "call_id", at)
            out.function_call(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            )
        elif kind == "function_call_output":
            call_id = _string(item, "call_id", at)
            output = _text(item.get("output"), f"{at}.output")
            out.add({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "reasoning":
            text = _reasoning_text(item)
            if text is not None:
                out.reasoning(text)
        elif kind == "item_reference":
            raise BadRequest(
                f"{at}: item_reference is not supported (this gateway keeps no item store); "
                "send the item itself",
                param=at,
            )
        elif kind in HOSTED_ITEMS:
            continue  # a hosted tool's item: the policy was never offered that tool
        else:
            raise BadRequest(f"{at}.type {kind!r} is not a supported input item type", param=f"{at}.type")
    out.flush()
    return out.messages


def instruction_messages(instructions: Any) -> list[dict[str, Any]]:
    if instructions is None or instructions == "":
        return []
    if isinstance(instructions, str):
        return [{"role": "system", "content": instructions}]
    return input_to_messages(instructions, "instructions")


def reasoning_kwargs(reasoning: Any) -> dict[str, Any]:
    """The template kwargs of a request's ``reasoning``: its ``effort`` as ``enable_thinking``
    (Qwen3's switch; a template without one ignores it). An on/off switch has no levels: "none" and
    "minimal" ask for (almost) no reasoning, the rest for some."""
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    if effort is None:
        return {}
    return {"enable_thinking": effort not in ("none", "minimal")}


def request_to_internal(
    body: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The internal ``(messages, tools)`` of a Responses request (see the module docstring)."""
    messages = instruction_messages(body.get("instructions"))
    messages += list(body.get(PREVIOUS_KEY) or [])
    messages += input_to_messages(body.get("input"))
    return messages, tools_to_internal(body.get("tools"))
