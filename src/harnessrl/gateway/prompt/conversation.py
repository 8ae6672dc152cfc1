"""Chat messages -> prompt token IDs, reusing the exact tokens the policy sampled earlier.

Pure functions (no I/O), so the property the whole project rests on is unit-testable: for a
harness that only appends to its history, call k+1's prompt starts with call k's prompt followed by
call k's sampled response, token for token.

The algorithm (``build_prompt``):

1. Normalize the messages (content parts -> one string, ``None`` -> "", tool-call arguments -> a
   JSON object when they parse, ``developer`` -> ``system``) and render the whole conversation with
   the policy's chat template and generation prompt: ``T_full``.
2. Among this rollout's earlier calls, find the one with the most messages such that the new
   ``messages[:n]`` equal its messages and ``messages[n]`` is semantically the assistant message
   it answered (same stripped text; same tool calls by name and parsed arguments; ids ignored).
3. Render ``messages[:n+1]`` without generation prompt: ``T_prefix``. If ``T_full`` starts with
   it, the new text is ``tail = T_full[len(T_prefix):]``, and ``glue`` is whatever the template
   put after the assistant turn's end-of-turn token (``"\\n"`` for ChatML).
4. prompt = earlier prompt + earlier response (+ the end-of-turn token if the sampled response did
   not end with a stop token, e.g. it hit ``max_tokens`` or a stop string) + encode(glue + tail).

Anything that does not line up falls back to ``encode(T_full)``; the result says which path was
taken (``reused``, ``first``, ``no_match``, ``mismatch``) for the metrics.

Incremental rendering (the default). Steps 1 and 3 render the whole conversation twice, which
makes every call O(context) even though only ``glue + tail`` is encoded. When the new messages
after the matched assistant turn contain no assistant turn (the append-only common case: tool
results, a user message), ``T_prefix``/``T_full`` are rendered from a short *surrogate*
conversation instead: the leading system message (it carries the tools header), the message before
the matched assistant turn, that turn, and the new messages. The tail depends only on these local
neighbours in the templates we know, but chat templates are not compositional in general, so the
first ``VERIFY_CALLS`` incremental splices are also computed the full way and compared; one
difference turns incremental rendering off for good. That record is a ``SpliceTrust``, passed in by
whoever owns the tokenizer (the gateway keeps one, ``history.CallHistory.trust``): these functions
hold no state of their own. Any failure
of the surrogate path (template error, prefix mismatch) falls back to the full path above, so the
prompt IDs are always the full path's. ``quick_prompt`` is that trusted incremental path alone: cheap
enough (a few short renders, one short encode) for the gateway to run on its event loop, sending only
the rest to a thread.

Normalizing and fingerprinting (step 2) is O(context) as well. ``key_messages`` makes it O(new
messages): an agent resends its whole history on every call, so the leading messages that are the
same JSON as the rollout's previous request's (``repeats.history_bytes``: one encoding of the list,
compared byte for byte) take their normalized form and key from it; only the new tail is normalized.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from harnessrl.errors import BadRequest
from harnessrl.gateway.json_input import json_problem
from harnessrl.gateway.prompt.repeats import HistoryBytes, history_bytes
from harnessrl.token_ids import KeptIds, TokenIds

if TYPE_CHECKING:
    from harnessrl.tokenizer import PolicyTokenizer

_KEEP_FIELDS = ("name", "tool_call_id", "reasoning_content")


def normalize_content(content: Any, where: str = "content") -> str:
    """One string from OpenAI content: a string, ``None``, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                pieces.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                text = part.get("text")
                if not isinstance(text, str):
                    raise BadRequest(f"{where}[{i}].text must be a string", param=f"{where}.{i}.text")
                pieces.append(text)
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequest(
                    f"{where}[{i}]: content part of type {kind!r} is not supported (text only)",
                    param=f"{where}.{i}",
                )
        return "".join(pieces)
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
        "content": normalize_content(message.get("content"), f"{where}.content"),
    }
    for key in _KEEP_FIELDS:
        if message.get(key) is not None:
            out[key] = message[key]
    calls = message.get("tool_calls") or []
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
    assistant turn's reasoning (``visible_text``): the sampled tokens hold it, whatever the
    harness sends back.
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
    ) -> PriorCall:
        keys = tuple(message_key(m) for m in normalize_messages(request_messages))
        return cls.from_keys(keys, answer, prompt_ids, response_ids)

    @classmethod
    def from_keys(
        cls,
        message_keys: Sequence[bytes],
        answer: dict[str, Any],
        prompt_ids: Sequence[int],
        response_ids: Sequence[int],
    ) -> PriorCall:
        """From the request's message keys as ``key_messages`` computed them (no re-normalizing)."""
        return cls(
            message_keys=tuple(message_keys),
            answer_key=message_key(normalize_message({**answer, "role": "assistant"})),
            prompt=KeptIds(prompt_ids),
            response_ids=tuple(response_ids),
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


@dataclass(frozen=True)
class PromptPlan:
    prompt_ids: list[int]
    result: str  # reused | first | no_match | mismatch
    reused_tokens: int = 0  # how many leading tokens were taken from an earlier call verbatim


def find_prior(keys: Sequence[bytes], priors: Iterable[PriorCall]) -> PriorCall | None:
    """The earlier call with the most messages whose history and answer this conversation continues."""
    best: PriorCall | None = None
    for prior in priors:
        n = len(prior.message_keys)
        if n >= len(keys) or (best is not None and n < len(best.message_keys)):
            continue
        if keys[n] == prior.answer_key and tuple(keys[:n]) == prior.message_keys:
            best = prior  # ties go to the later call
    return best


def build_prompt(
    tokenizer: PolicyTokenizer,
    messages: Sequence[dict[str, Any]],
    priors: Iterable[PriorCall] = (),
    *,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
    incremental: bool = True,
    keys: Sequence[bytes] | None = None,
    history: str = "sampled",
    trust: SpliceTrust | None = None,
) -> PromptPlan:
    """Prompt token IDs for ``messages`` (already normalized), splicing in earlier sampled tokens.

    ``incremental=False`` always renders the whole conversation (the reference path). ``keys``: the
    messages' ``message_key``s if already computed (``key_messages``). ``history="as_rendered"``:
    the prompt is what the template renders, as a deployed server would tokenize it (no splice).
    ``trust``: how far incremental splices with this tokenizer are verified (a fresh one, which
    verifies every splice the full way, when not given)."""
    trust = SpliceTrust() if trust is None else trust
    kwargs = template_kwargs or {}
    if history == "as_rendered":
        text = tokenizer.render_chat(list(messages), tools=tools, add_generation_prompt=True, **kwargs)
        return PromptPlan(tokenizer.encode_conversation(text), "as_rendered")
    priors = list(priors)
    keys = [message_key(m) for m in messages] if keys is None else keys
    prior = find_prior(keys, priors)
    if prior is not None and incremental and not trust.refuted:
        spliced = _splice_incremental(tokenizer, messages, prior, tools, kwargs)
        if spliced is not None:
            if trust.trusted:
                return PromptPlan(spliced, "reused", prior.token_count)
            full = build_prompt(
                tokenizer,
                messages,
                [prior],
                tools=tools,
                template_kwargs=kwargs,
                incremental=False,
                keys=keys,
            )
            trust.verify(full.prompt_ids == spliced)
            return full
    full_text = tokenizer.render_chat(list(messages), tools=tools, add_generation_prompt=True, **kwargs)
    if prior is None:
        return PromptPlan(tokenizer.encode_conversation(full_text), "no_match" if priors else "first")
    n = len(prior.message_keys)
    prefix_text = tokenizer.render_chat(
        list(messages[: n + 1]), tools=tools, add_generation_prompt=False, **kwargs
    )
    spliced = _splice(tokenizer, prior, prefix_text, full_text)
    if spliced is None:
        # The template renders the shared history differently once more turns follow (Qwen3 drops
        # the reasoning of earlier turns): keep the sampled tokens, add what follows the turn.
        spliced = _splice_after_turn(tokenizer, messages, n, prior, full_text, tools, kwargs)
    if spliced is None:
        return PromptPlan(tokenizer.encode_conversation(full_text), "mismatch")
    return PromptPlan(spliced, "reused", prior.token_count)


def quick_prompt(
    tokenizer: PolicyTokenizer,
    messages: Sequence[dict[str, Any]],
    priors: Iterable[PriorCall],
    keys: Sequence[bytes],
    *,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
    history: str = "sampled",
    trust: SpliceTrust | None = None,
) -> PromptPlan | None:
    """``build_prompt``'s result when it comes from a trusted incremental splice, else ``None``.

    The cheap case only: a few renders of a short surrogate conversation and one encode of the new
    tail. Everything that renders or encodes the whole conversation (no match, a splice still being
    verified, a failed splice) returns ``None`` for ``build_prompt`` to do, off the event loop.
    """
    if history != "sampled" or trust is None or not trust.trusted:
        return None
    prior = find_prior(keys, priors)
    if prior is None:
        return None
    spliced = _splice_incremental(tokenizer, messages, prior, tools, template_kwargs or {})
    if spliced is None:
        return None
    return PromptPlan(spliced, "reused", prior.token_count)


#: Incremental splices checked against the full path before the incremental path is trusted.
VERIFY_CALLS = 2


class SpliceTrust:
    """How far incremental splices with one tokenizer (one chat template) have been verified:
    ``VERIFY_CALLS`` agreeing with the full path trust it; one disagreeing refutes it for good."""

    def __init__(self) -> None:
        self.checks = 0  # splices verified so far; -1 once one differed from the full path

    @property
    def trusted(self) -> bool:
        return self.checks >= VERIFY_CALLS

    @property
    def refuted(self) -> bool:
        return self.checks < 0

    def verify(self, agreed: bool) -> None:
        """Count one splice checked against the full path."""
        if not self.refuted:
            self.checks = self.checks + 1 if agreed else -1


def _splice_incremental(
    tokenizer: PolicyTokenizer,
    messages: Sequence[dict[str, Any]],
    prior: PriorCall,
    tools: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
) -> list[int] | None:
    """The spliced prompt rendered from a surrogate conversation, or ``None`` to use the full path."""
    n = len(prior.message_keys)
    tail = list(messages[n + 1 :])
    if any(m["role"] == "assistant" for m in tail):
        return None  # an assistant turn in the tail may render by global rules (e.g. dropped <think>)
    head = [messages[0]] if messages[0]["role"] == "system" and n > 0 else []
    before = [messages[n - 1]] if n - 1 >= len(head) else []
    surrogate = [*head, *before, messages[n]]
    try:
        prefix_text = tokenizer.render_chat(surrogate, tools=tools, add_generation_prompt=False, **kwargs)
        full_text = tokenizer.render_chat(surrogate + tail, tools=tools, add_generation_prompt=True, **kwargs)
    except Exception:  # a template may refuse the surrogate (e.g. role-alternation checks)
        return None
    return _splice(tokenizer, prior, prefix_text, full_text)


def _splice(
    tokenizer: PolicyTokenizer, prior: PriorCall, prefix_text: str, full_text: str
) -> list[int] | None:
    if not full_text.startswith(prefix_text):
        return None  # the template renders the shared history differently with more turns after it
    stop_ids = list(tokenizer.stop_token_ids)
    # The end-of-turn token closing the assistant turn is the last stop-token string in the prefix.
    best_pos, eot_id, eot_text = -1, None, ""
    for token_id, text in zip(stop_ids, tokenizer.token_texts(stop_ids), strict=True):
        if not text:
            continue
        pos = prefix_text.rfind(text)
        if pos > best_pos:
            best_pos, eot_id, eot_text = pos, token_id, text
    if eot_id is None:
        return None
    glue = prefix_text[best_pos + len(eot_text) :]
    if glue.strip():
        # Text after the last end-of-turn token means the assistant turn did not end with one (an
        # unusual template); splicing would duplicate or drop text, so tokenize fully instead.
        return None
    tail = full_text[len(prefix_text) :]
    # The turn was cut (max_tokens, a stop string): close it as the template does.
    close = [] if prior.ends_with_stop(stop_ids) else [eot_id]
    return TokenIds.joined(prior.prompt, prior.response_ids, close, tokenizer.encode(glue + tail))


#: Stands in for the content of the message after a reused turn, to find where that turn ends.
_MARK = "\u2063harnessrl-next-message\u2063"


def _turn_ends(tokenizer: PolicyTokenizer, text: str) -> list[tuple[int, int]]:
    """``(end position, token id)`` of every end-of-turn (stop-token) text in ``text``, in order."""
    ends: list[tuple[int, int]] = []
    for token_id in tokenizer.stop_token_ids:
        token_text = tokenizer.decode([token_id])
        if not token_text:
            continue
        start = text.find(token_text)
        while start >= 0:
            ends.append((start + len(token_text), token_id))
            start = text.find(token_text, start + len(token_text))
    return sorted(ends)


def _splice_after_turn(
    tokenizer: PolicyTokenizer,
    messages: Sequence[dict[str, Any]],
    n: int,
    prior: PriorCall,
    full_text: str,
    tools: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
) -> list[int] | None:
    """``history = "sampled"`` where the template rewrites earlier turns: the earlier call's prompt
    and sampled answer, then the text the template renders after that answer's turn ends.

    Where the turn ends is found structurally: the message after it is rendered with a marker for
    its content, and the turn ends at the last end-of-turn text before the marker. The splice is
    refused (``None``) unless the render has exactly as many turn ends before that point as the
    earlier call's tokens (so no text the template put between turns is lost) and the text from
    there to the marker reads the same in the real render.
    """
    if n + 1 >= len(messages) or messages[n + 1]["role"] == "assistant":
        return None
    marked = [*messages[: n + 1], {**messages[n + 1], "content": _MARK}, *messages[n + 2 :]]
    try:
        marked_text = tokenizer.render_chat(marked, tools=tools, add_generation_prompt=True, **kwargs)
    except Exception:  # a template may refuse the marked message (it checks the content)
        return None
    mark_at = marked_text.find(_MARK)
    if mark_at < 0 or marked_text.count(_MARK) != 1:
        return None
    ends_before = [end for end in _turn_ends(tokenizer, marked_text) if end[0] <= mark_at]
    stop_ids = set(tokenizer.stop_token_ids)
    closed = prior.ends_with_stop(stop_ids)
    sampled = (*prior.prompt_ids, *prior.response_ids)
    sampled_ends = sum(1 for token_id in sampled if token_id in stop_ids) + (0 if closed else 1)
    if not ends_before or len(ends_before) != sampled_ends:
        return None
    end, eot_id = ends_before[-1]
    real_ends = _turn_ends(tokenizer, full_text)
    if len(real_ends) < len(ends_before):
        return None
    real_end, real_eot = real_ends[len(ends_before) - 1]
    between = marked_text[end:mark_at]  # glue and the next message's header
    if real_eot != eot_id or not full_text.startswith(between, real_end):
        return None
    # The turn was cut (max_tokens, a stop string): close it as the template does.
    close = [] if closed else [eot_id]
    return TokenIds.joined(prior.prompt, prior.response_ids, close, tokenizer.encode(full_text[real_end:]))
