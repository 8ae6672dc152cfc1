"""Chat messages normalized and fingerprinted: what history matching compares.

``normalize_message`` turns a message into the one form prompt building and matching use (content
parts -> one string, ``None`` -> "", tool-call arguments -> a JSON object when they parse,
``developer`` -> ``system``; the reasoning kept under whichever name it came by; Claude Code's
per-conversation attribution line taken out of system text, as vLLM does: ``BILLING_HEADER``); ``message_key``
fingerprints it semantically (stripped text, tool calls by name and parsed arguments, ids ignored);
``template_key`` fingerprints what else the template is rendered with (the tools and the template
kwargs); ``PriorCall`` is an answered call as reuse remembers it.

``key_messages`` makes keying O(new messages): an agent resends its whole history on every call, so
the leading messages that are the same JSON as the rollout's previous request's
(``repeats.history_bytes``: one encoding of the list, compared byte for byte) take their normalized
form and key from it; only the new tail is normalized.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from harnessrl.chat_template import REASONING_FIELDS, tools_json
from harnessrl.errors import BadRequest
from harnessrl.gateway.json_input import json_problem
from harnessrl.gateway.prompt.repeats import HistoryBytes, history_bytes
from harnessrl.token_ids import KeptIds

#: Fields kept as sent. The reasoning is kept under each name it may come by (``reasoning_content``,
#: and ``thinking`` or vLLM's and OpenRouter's newer ``reasoning``), not renamed here: the template
#: is then given it as transformers gives it (``chat_template.template_message`` fills the names
#: templates read, in transformers' order when several are set). Matching ignores all of them.
_KEEP_FIELDS = ("name", "tool_call_id", *REASONING_FIELDS)


#: The first line of a system text Claude Code writes for Anthropic's billing (``x-anthropic-billing-header:
#: cc_version=2.1.197.<3 hex digits of the first user message>; cc_entrypoint=cli;``, a per-request
#: hash too on some accounts). vLLM leaves it out of the prompt (its chat and Messages routes both),
#: so a policy deployed there never sees it; rendered here, training saw a line deployment does not,
#: and system prompts that differ at their first token across tasks (no prefix shared between them).
BILLING_HEADER = "x-anthropic-billing-header"


def without_billing_header(text: str) -> str:
    """``text`` without its first line if that line is Claude Code's billing header (vLLM's rule)."""
    return text.partition("\n")[2] if text.startswith(BILLING_HEADER) else text


def normalize_content(
    content: Any, where: str = "content", *, system: bool = False, tool: bool = False
) -> str:
    """One string from OpenAI content: a string, ``None``, or a list of text parts, joined as they
    are (``tool``: a tool result's, one part a line, as vLLM joins a tool message's text parts
    whatever the template). ``system``: a system message's, whose text (each part) loses Claude
    Code's billing header line."""
    if content is None:
        return ""
    if isinstance(content, str):
        return without_billing_header(content) if system else content
    if isinstance(content, list):
        pieces = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                pieces.append(without_billing_header(part) if system else part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                text = part.get("text")
                if not isinstance(text, str):
                    raise BadRequest(f"{where}[{i}].text must be a string", param=f"{where}.{i}.text")
                pieces.append(without_billing_header(text) if system else text)
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequest(
                    f"{where}[{i}]: content part of type {kind!r} is not supported (text only)",
                    param=f"{where}.{i}",
                )
        return ("\n" if tool else "").join(pieces)
    raise BadRequest(f"{where} must be a string, a list of parts, or null", param=where)


def normalize_arguments(arguments: Any) -> Any:
    """Tool-call arguments as a JSON object when they are one (a string or a dict), else unchanged.

    Parsed as strictly as a request body (``json_input.parse_json``): a string that only lenient JSON
    reads (NaN, lone surrogates) or that nests too deep stays a string, so the template never sees
    a value that fails it or the tokenizer.
    """
    if isinstance(arguments, str):
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
        return parsed if isinstance(parsed, dict) and json_problem(parsed) is None else arguments
    return arguments


def normalize_message(message: dict[str, Any], index: int = 0) -> dict[str, Any]:
    """The message in the one shape the chat template and the matching both see."""
    where = f"messages.{index}"
    role = message.get("role")
    if not isinstance(role, str):
        raise BadRequest(f"{where}.role is required", param=f"{where}.role")
    role = {"developer": "system", "function": "tool"}.get(role, role)
    out: dict[str, Any] = {
        "role": role,
        "content": normalize_content(
            message.get("content"), f"{where}.content", system=role == "system", tool=role == "tool"
        ),
    }
    for key in _KEEP_FIELDS:
        value = message.get(key)
        if value is None:
            continue
        if key in REASONING_FIELDS and not isinstance(value, str):
            # A template would print its Python form (``['x']``) into the prompt, or fail on it.
            raise BadRequest(f"{where}.{key} must be a string", param=f"{where}.{key}")
        out[key] = value
    calls = message.get("tool_calls") or _legacy_function_call(message, where)
    if calls:
        out["tool_calls"] = []
        for j, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise BadRequest(
                    f"{where}.tool_calls.{j}.function.name is required", param=f"{where}.tool_calls.{j}"
                )
            out["tool_calls"].append(
                {
                    "id": call.get("id") or f"call_{index}_{j}",
                    "type": "function",
                    "function": {
                        "name": fn["name"],
                        "arguments": normalize_arguments(fn.get("arguments", {})),
                    },
                }
            )
    return out


def _legacy_function_call(message: dict[str, Any], where: str) -> list[Any]:
    """An assistant turn's ``function_call`` (OpenAI's deprecated form of one tool call) as its
    ``tool_calls``: the template renders only those, so the call would vanish from the prompt while
    the ``function`` message answering it (a ``tool`` message here) stays."""
    legacy = message.get("function_call")
    if legacy is None:
        return []
    if message.get("role") != "assistant" or not isinstance(legacy, dict):
        raise BadRequest(
            f"{where}.function_call must be an object, on an assistant message",
            param=f"{where}.function_call",
        )
    if not isinstance(legacy.get("name"), str):
        raise BadRequest(f"{where}.function_call.name is required", param=f"{where}.function_call.name")
    if not isinstance(legacy.get("arguments", ""), str | dict):  # as a ``tool_calls`` entry's
        raise BadRequest(
            f"{where}.function_call.arguments must be a string or an object",
            param=f"{where}.function_call.arguments",
        )
    return [{"type": "function", "function": legacy}]


def normalize_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [normalize_message(m, i) for i, m in enumerate(messages)]


def _canonical(value: Any) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # what orjson cannot encode (integers past 64 bits): the slower, lenient json
        return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def visible_text(content: str) -> str:
    """An assistant turn's text without its reasoning: what every harness sends back the same way.

    The gateway answers chat calls with the sampled text, ``<think>…</think>`` included; litellm
    (mini-swe-agent) moves that block to ``reasoning_content``, other harnesses drop it, Anthropic
    and Responses clients send it as a block or an item. Matching on the text after the reasoning
    finds the call whichever way the harness chose.
    """
    if "</think>" in content:
        content = content.rsplit("</think>", 1)[1]
    return content.strip()


def message_key(message: dict[str, Any]) -> bytes:
    """A comparable fingerprint of a normalized message: what it says, not how it was serialized.

    Ignored: tool-call ids, surrounding whitespace, JSON key order and spacing in arguments, and an
    assistant turn's reasoning (``visible_text``; ``REASONING_FIELDS``, under whichever name): the
    sampled tokens hold it, whatever the harness sends back.
    """
    # Arguments go in as values: the sorted-key compact encoding of the whole key normalizes them.
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
    content = message["content"]
    return _canonical(
        {
            "role": message["role"],
            "content": visible_text(content) if message["role"] == "assistant" else content.strip(),
            "tool_calls": calls,
            "name": message.get("name"),
        }
    )


#: What a prompt is rendered with besides its messages: the tools' JSON as the template gets them
#: (key order kept: the template prints them in order) and the template kwargs' (sorted keys).
TemplateKey = tuple[bytes, bytes]
#: The ``template_key`` of a call with neither tools nor template kwargs.
NO_TEMPLATE_CONTEXT: TemplateKey = (b"", b"")


def kwargs_json(kwargs: dict[str, Any] | None) -> bytes:
    """The template kwargs' half of a ``TemplateKey`` (``b""`` for none)."""
    return _canonical(kwargs) if kwargs else b""


def template_key(tools: Any, kwargs: dict[str, Any] | None) -> TemplateKey:
    """A comparable fingerprint of what the chat template renders a call's messages with.

    Two calls with equal message keys render to the same prompt only if this is equal too: a
    harness that adds a tool mid-rollout (an MCP server connecting) or changes a template kwarg
    (``reasoning_effort``) changes the system header of every later prompt.

    The tools' JSON is kept whole, not hashed: the gateway takes it from where the tokenizer keeps
    the prepared tools by it (``conversation.prompt_template_key``: ~0.3 us a call with a 30 KB
    list, where encoding it costs ~30 us and hashing it as much again), equal keys are then mostly
    the same ``bytes`` objects (compared in ~0.04 us; equal copies in ~3 us) and unequal ones
    mostly differ in length. This function encodes: for a stored request (``history``).
    """
    return (tools_json(tools), kwargs_json(kwargs))


@dataclass(frozen=True)
class PriorCall:
    """What reuse needs to remember of one answered chat call."""

    message_keys: tuple[bytes, ...]  # fingerprints of the request's normalized messages
    answer_key: bytes  # fingerprint of the assistant message the gateway answered with
    # The call's prompt, then its sampled response: what the next call's prompt starts with. The
    # prompt is kept with the encodings the recorded call's ``TokenIds`` had, so a prompt spliced from
    # it derives its own from them; both as exact tuples, which the garbage collector stops tracking.
    prompt: KeptIds
    response_ids: tuple[int, ...]
    # The tools and template kwargs the call's prompt was rendered with (``template_key``): a
    # later call rendered with others cannot reuse this call's tokens.
    template_key: TemplateKey = NO_TEMPLATE_CONTEXT

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        return self.prompt.ids

    @property
    def token_count(self) -> int:
        return len(self.prompt) + len(self.response_ids)

    def ends_with_stop(self, stop_ids: Collection[int]) -> bool:
        """Whether the sampled response ended with a stop token (it closed its turn itself)."""
        return bool(self.response_ids) and self.response_ids[-1] in stop_ids

    @classmethod
    def from_call(
        cls,
        request_messages: Sequence[dict[str, Any]],
        answer: dict[str, Any],
        prompt_ids: Sequence[int],
        response_ids: Sequence[int],
        template_key: TemplateKey = NO_TEMPLATE_CONTEXT,
    ) -> PriorCall:
        keys = tuple(message_key(m) for m in normalize_messages(request_messages))
        return cls.from_keys(keys, answer, prompt_ids, response_ids, template_key)

    @classmethod
    def from_keys(
        cls,
        message_keys: Sequence[bytes],
        answer: dict[str, Any],
        prompt_ids: Sequence[int],
        response_ids: Sequence[int],
        template_key: TemplateKey = NO_TEMPLATE_CONTEXT,
    ) -> PriorCall:
        """From the request's message keys as ``key_messages`` computed them (no re-normalizing)."""
        return cls(
            message_keys=tuple(message_keys),
            answer_key=message_key(normalize_message({**answer, "role": "assistant"})),
            prompt=KeptIds(prompt_ids),
            response_ids=tuple(response_ids),
            template_key=template_key,
        )


@dataclass(frozen=True)
class KeyedMessages:
    """A request's messages normalized and fingerprinted, with what the next request needs to reuse it."""

    messages: list[dict[str, Any]]  # normalized (``normalize_message``)
    keys: tuple[bytes, ...]  # ``message_key`` of each
    history: HistoryBytes | None  # the messages as received, encoded (``repeats``); None: unencodable


def key_messages(
    raw: Sequence[Any],
    previous: KeyedMessages | None = None,
    repeated: tuple[HistoryBytes, int] | None = None,
) -> KeyedMessages:
    """Normalize and fingerprint ``raw`` (``BadRequest`` for a malformed message), reusing the work
    done for ``previous`` (the rollout's last request) on the leading messages it repeats exactly.

    ``repeated``: ``repeats.history_bytes(raw, previous.history)`` when the caller has it already.
    Reuse is by position, so a message keeps the index its default tool-call ids were made from.
    A reused message was validated when ``previous`` was keyed.
    """
    if repeated is None:
        repeated = history_bytes(raw, previous.history if previous is not None else None)
    history, same = repeated if repeated is not None else (None, 0)
    reused_messages = previous.messages[:same] if previous is not None else []
    reused_keys = previous.keys[:same] if previous is not None else ()
    new = [normalize_message(m, i) for i, m in enumerate(raw[same:], start=same)]
    return KeyedMessages(
        messages=[*reused_messages, *new],
        keys=(*reused_keys, *(message_key(m) for m in new)),
        history=history,
    )
