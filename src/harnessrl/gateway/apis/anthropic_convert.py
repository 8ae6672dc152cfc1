"""Anthropic Messages requests -> the internal conversation model (OpenAI chat messages + tools).

``request_to_internal`` is a pure function of the request body, registered for ``api="messages"``
in ``gateway.apis.CONVERTERS``: the live handler and the reuse memory rebuilt after a restart both
go through it, so a stored request always maps to the same internal messages.

Mapping (what the chat template and the history matching see):

- ``system`` (a string or text blocks) and ``role: "system"`` messages -> ``system`` messages.
- ``text`` blocks -> content. User and system blocks are joined with a blank line (they are
  separate paragraphs, e.g. Claude Code's ``<system-reminder>`` blocks); assistant text blocks are
  joined with nothing, because that is how the gateway split its own answer into blocks.
- ``tool_use`` -> an assistant ``tool_calls`` entry (the block id is the call id, ``input`` is
  serialized to a JSON string); ``tool_result`` -> a ``role: "tool"`` message, placed before any
  text of the same user turn (Anthropic requires tool results to lead the turn anyway).
- ``thinking`` -> ``reasoning_content``; ``redacted_thinking`` is dropped (opaque, the gateway never
  produces it, and it cannot be rendered).
- Consecutive assistant messages are merged into one turn, as Anthropic's API does: some clients
  send one answer's thinking, text and tool_use as separate messages. So are consecutive user
  messages' texts (joined as one message's text blocks are).
- ``cache_control``, ``citations``, ``signature`` and other block annotations are ignored, so
  moving cache markers between turns never changes the internal conversation.
- ``image`` / ``document`` (and any other non-text block) -> 400: the policy reads text only, and
  silently dropping them would train on a conversation the harness did not send (the chat API
  refuses non-text parts the same way).
- ``tools``: custom tools (``name``, ``description``, ``input_schema``) -> OpenAI function tools;
  Anthropic server tools (``web_search_…``, ``bash_…`` and other typed tools without an
  ``input_schema``) are dropped: the gateway cannot run them. A custom tool's ``description`` must
  be a string (or absent) and its ``input_schema`` an object: the template renders them, and one of
  another type fails it.
- ``thinking`` -> the template kwarg ``enable_thinking`` (``thinking_kwargs``), passed whether or
  not the template reads it (one that does not ignores it), so the kwargs are a function of the
  request alone, as reuse needs them to be (``apis.template_context``).
- A conversation that ends with an assistant message (a prefill, which Anthropic's API continues)
  -> 400: the gateway renders each call as a new assistant turn after the conversation, and
  continuing a turn the client wrote would record a prompt whose last turn the template never
  closed; ``messages`` is named.
"""

from __future__ import annotations

import json
from typing import Any

from harnessrl.errors import BadRequest
from harnessrl.gateway.body_models import JsonInt, Lenient
from harnessrl.gateway.prompt.messages import without_billing_header

Internal = tuple[list[dict[str, Any]], list[dict[str, Any]] | None]


class ThinkingParam(Lenient):
    # "enabled", "adaptive", "between_tools"... anything but "disabled" switches reasoning on; new
    # types appear with new models, and refusing them would break a harness for no gain.
    type: str
    budget_tokens: JsonInt | None = None


def _block_text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise BadRequest(f"{where}.text must be a string", param=f"{where}.text")
    return text


def _unsupported(block: Any, where: str) -> BadRequest:
    kind = block.get("type") if isinstance(block, dict) else type(block).__name__
    return BadRequest(
        f"{where}: content block of type {kind!r} is not supported here (this policy reads text only)",
        param=where,
    )


def _text_of(content: Any, where: str, joiner: str = "\n\n") -> str:
    """A string from a string or a list of text blocks (system prompts, tool results)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of content blocks", param=where)
    texts = []
    for i, block in enumerate(content):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise _unsupported(block, f"{where}.{i}")
        texts.append(_block_text(block, f"{where}.{i}"))
    return joiner.join(texts)


def _system_text(content: Any, where: str) -> str:
    """A system prompt's text (``_text_of``) without Claude Code's billing header: its own first block
    (``messages.BILLING_HEADER``), left out as vLLM's Messages route leaves it out. The request itself
    is not changed (it is recorded as the harness sent it)."""
    if isinstance(content, str):
        return without_billing_header(content)
    if isinstance(content, list):
        kept = []
        for block in content:
            if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
                text = without_billing_header(block["text"])
                if not text:
                    continue
                block = {**block, "text": text}
            kept.append(block)
        content = kept
    return _text_of(content, where)


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of content blocks", param=where)
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise BadRequest(f"{where}.{i} must be a content block with a 'type'", param=f"{where}.{i}")
    return content


def _user_messages(content: Any, where: str) -> list[dict[str, Any]]:
    tool_messages: list[dict[str, Any]] = []
    texts: list[str] = []
    for i, block in enumerate(_blocks(content, where)):
        at = f"{where}.{i}"
        kind = block["type"]
        if kind == "text":
            texts.append(_block_text(block, at))
        elif kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise BadRequest(f"{at}.tool_use_id is required", param=f"{at}.tool_use_id")
            # ``is_error`` is not rendered: the content already says what failed (Claude Code wraps
            # it in <tool_use_error>), and the chat template has no place for a flag.
            tool_messages.append(
                {
                    "role": "tool",
                    "tool_call_id": block["tool_use_id"],
                    # Its text blocks on separate lines, as vLLM's Messages route joins them.
                    "content": _text_of(block.get("content"), f"{at}.content", joiner="\n"),
                }
            )
        else:
            raise _unsupported(block, at)
    out = tool_messages
    if texts or not tool_messages:
        out.append({"role": "user", "content": "\n\n".join(texts)})
    return out


def _assistant_message(content: Any, where: str) -> dict[str, Any]:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(_blocks(content, where)):
        at = f"{where}.{i}"
        kind = block["type"]
        if kind == "text":
            texts.append(_block_text(block, at))
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise BadRequest(f"{at}.thinking must be a string", param=f"{at}.thinking")
            thinking.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue
        elif kind in ("tool_use", "server_tool_use"):
            if not isinstance(block.get("name"), str) or not isinstance(block.get("id"), str):
                raise BadRequest(f"{at}: tool_use needs 'id' and 'name'", param=at)
            tool_input = block.get("input", {})
            calls.append(
                {
                    "id": block["id"],
                    "type": "function",
                    "function": {
                        "name": block["name"],
                        "arguments": json.dumps(tool_input, ensure_ascii=False),
                    },
                }
            )
        else:
            raise _unsupported(block, at)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    return message


def _merge_assistant(into: dict[str, Any], more: dict[str, Any]) -> None:
    into["content"] += more["content"]
    if more.get("tool_calls"):
        into["tool_calls"] = into.get("tool_calls", []) + more["tool_calls"]
    if more.get("reasoning_content"):
        into["reasoning_content"] = into.get("reasoning_content", "") + more["reasoning_content"]


def convert_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    out = []
    for i, tool in enumerate(tools or []):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise BadRequest(f"tools.{i}.name is required", param=f"tools.{i}.name")
        if tool.get("type") not in (None, "custom") or "input_schema" not in tool:
            continue  # an Anthropic server tool (web search, computer use...): nothing here can run it
        if tool.get("description") is not None and not isinstance(tool["description"], str):
            raise BadRequest(f"tools.{i}.description must be a string", param=f"tools.{i}.description")
        if not isinstance(tool["input_schema"], dict):
            raise BadRequest(f"tools.{i}.input_schema must be an object", param=f"tools.{i}.input_schema")
        # In OpenAI's order (name, description, parameters): the template renders the tools' JSON as
        # it is, and a Messages call must build the prompt a chat call with the same tools builds.
        function = {"name": tool["name"]}
        if tool.get("description"):
            function["description"] = tool["description"]
        function["parameters"] = tool["input_schema"]
        out.append({"type": "function", "function": function})
    return out or None


def thinking_kwargs(thinking: Any) -> dict[str, Any]:
    """The template kwargs of a request's ``thinking``: ``enable_thinking`` (Qwen3's reasoning
    switch; a template without one ignores it), on for any type but ``"disabled"``."""
    if not isinstance(thinking, dict) or not isinstance(thinking.get("type"), str):
        return {}
    return {"enable_thinking": thinking["type"] != "disabled"}


def refuse_prefill(messages: list[dict[str, Any]]) -> None:
    """400 for a conversation that ends with an assistant message (a prefill): see the module
    docstring. Not part of ``request_to_internal``, which also reads stored requests."""
    if messages and messages[-1]["role"] == "assistant":
        raise BadRequest(
            "messages: the last message is from the assistant (a prefill to continue); this gateway "
            "does not continue an assistant message: end the conversation with a user message",
            param="messages",
        )


def request_to_internal(request: dict[str, Any]) -> Internal:
    """The internal ``(messages, tools)`` of a Messages request body; 400 (``BadRequest``) if unusable."""
    messages: list[dict[str, Any]] = []
    system = _system_text(request.get("system"), "system")
    if system:
        messages.append({"role": "system", "content": system})
    raw = request.get("messages")
    if not isinstance(raw, list):
        raise BadRequest("messages must be a list", param="messages")
    for i, message in enumerate(raw):
        where = f"messages.{i}"
        if not isinstance(message, dict):
            raise BadRequest(f"{where} must be an object", param=where)
        role, content = message.get("role"), message.get("content")
        if role == "system":
            messages.append({"role": "system", "content": _system_text(content, f"{where}.content")})
        elif role == "user":
            turn = _user_messages(content, f"{where}.content")
            if turn[0]["role"] == "user" and messages and messages[-1]["role"] == "user":
                # Consecutive user turns are one turn, as Anthropic's API combines them (templates
                # that require alternating roles refused the request otherwise).
                messages[-1]["content"] += "\n\n" + turn.pop(0)["content"]
            messages.extend(turn)
        elif role == "assistant":
            turn = _assistant_message(content, f"{where}.content")
            if messages and messages[-1]["role"] == "assistant":
                _merge_assistant(messages[-1], turn)
            else:
                messages.append(turn)
        else:
            raise BadRequest(f"{where}.role must be 'user', 'assistant' or 'system'", param=f"{where}.role")
    return messages, convert_tools(request.get("tools"))


def message_of_blocks(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """The internal assistant message of an answer's content blocks, as ``request_to_internal`` reads
    them back in the next request: text joined, thinking as ``reasoning_content``, each ``tool_use``
    a tool call whose arguments are its ``input`` as JSON."""
    text = "".join(b.get("text") or "" for b in blocks if b.get("type") == "text")
    thinking = "".join(b.get("thinking") or "" for b in blocks if b.get("type") == "thinking")
    calls = [
        {
            "id": b["id"],
            "type": "function",
            "function": {
                "name": b["name"],
                "arguments": json.dumps(b.get("input") or {}, ensure_ascii=False),
            },
        }
        for b in blocks
        if b.get("type") == "tool_use"
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = thinking
    return message
