"""Recorded conversations → the student's token sequences, with loss on the answer tokens only.

For each call (``conversations.Conversation``), with the *student's* tokenizer and chat template:

1. ``prompt`` = the conversation rendered with the generation prompt, encoded: exactly what the
   gateway would send the student's engine for this request;
2. the answer's text = the conversation *with* the answer rendered without generation prompt, minus
   ``prompt``'s text (the template must render the prompt as a prefix of the whole, else the call
   is skipped: ``prefix_mismatch``); encoded, cut after its end-of-turn token (the student's stop
   token): those tokens carry loss 1; what the template writes after it (``"\\n"`` in ChatML) is
   glue the student never samples, so it only appears as the next call's context;
3. only an answer that ended naturally is trained on (``NATURAL_ENDINGS``: ``stop``,
   ``tool_calls``, as the gateway records every API's natural end, and ``function_call``, the older
   OpenAI name a teacher upstream may send): one cut at its token limit (``length``), stopped by a
   content filter (``content_filter``: partial text) or ended any other way is skipped
   (``truncated``): the template would close it with an end-of-turn token, teaching the student to
   stop mid-answer; so is an answer with nothing in it (no text, reasoning or tool call:
   ``empty_answer``), which would teach the student to end its turn at once. ``--export-jsonl``
   applies the same two rules (``answer_skip``);
4. the answer must survive the round trip through the student's own parsers (the gateway's
   reasoning and tool-call parsers for the student's family, ``model_formats``): the text the
   student would sample, parsed as the gateway would parse it, gives back the teacher's content,
   reasoning and tool calls (name and arguments as JSON values). If not, the template cannot express
   the answer (a template that drops reasoning, a tool-call format that cannot carry it) and the call
   is counted and skipped (``reasoning_dropped``, ``tool_calls_lost``, ``content_changed``), never
   trained on in a mangled form.

The template's variables are those the gateway renders the request with (``request_template_kwargs``):
a chat call's ``chat_template_kwargs``, a Messages call's ``thinking`` and a Responses call's
``reasoning.effort`` as the template's thinking switch (``enable_thinking``), over
``sft.chat_template_kwargs``.

Chains: each prompt is built by the gateway's own ``build_prompt`` (its reference path), with the
earlier rendered calls as what it reuses: a call whose history continues an earlier call (its messages
and answer, matched as the gateway matches them) reuses that call's prompt and answer IDs and encodes
only the rest (glue, tool output, the next turn's opening), as the gateway builds the student's
prompts when it serves it (the sampled IDs of earlier turns are reused, never re-encoded; re-encoding
would merge e.g. an answer's trailing ``"\n"`` with the template's), and keeps the earlier turn as it
was even where the template renders it otherwise once more turns follow (Qwen3 drops the reasoning of
turns before the last user message; the gateway's prompt keeps it). The rendered calls then become
token-exact ``Call``s (prompt IDs, answer IDs) and go through the RL sample builder itself
(``trajectory.build_rollout_samples``), so calls whose prompt extends an earlier call's prompt +
answer train as one sequence, with the same break reasons. Context tokens (the first prompt, tool output, glue) carry loss 0.

Pure Python (no torch).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from harnessrl.errors import BadRequest, ConfigError
from harnessrl.gateway.apis.anthropic import thinking_template_kwargs
from harnessrl.gateway.apis.anthropic_convert import ThinkingParam
from harnessrl.gateway.apis.responses import thinking_kwargs
from harnessrl.gateway.parsers.formats import ModelFormats
from harnessrl.gateway.parsers.reasoning import get_reasoning_parser, split_reasoning
from harnessrl.gateway.parsers.tools import parse_tool_calls
from harnessrl.gateway.prompt.conversation import build_prompt, prompt_template_key
from harnessrl.gateway.prompt.messages import PriorCall
from harnessrl.gateway.teacher.recording import NATURAL_ENDINGS as TEACHER_NATURAL_ENDINGS
from harnessrl.schemas import Call, Rollout
from harnessrl.sft.conversations import (
    Conversation,
    NoConversation,
    conversation,
    final_calls,
    with_recorded_answers,
)
from harnessrl.tokenizer import PolicyTokenizer
from harnessrl.trajectory import CALLS_SEEN_KEY, Sample, build_rollout_samples

#: Why a call's answer was not trained on (``RenderReport.skipped``).
SKIP_REASONS: tuple[str, ...] = (
    "raw_completion",
    "no_answer",
    "unreadable_request",
    "template_error",
    "prefix_mismatch",
    "reasoning_dropped",
    "tool_calls_lost",
    "content_changed",
    "empty_answer",
    "truncated",
)


#: The finish reasons of an answer that ended where its model chose to (teacher mode's own list). The
#: gateway records every call's finish reason in OpenAI chat's terms (a Messages ``end_turn``/
#: ``tool_use`` and a Responses ``completed`` call are recorded as ``stop``/``tool_calls``); teacher
#: mode records any other ending as the upstream said it: ``length``, ``content_filter``, Anthropic's
#: ``refusal`` or ``pause_turn``, an unfinished Response's status, a provider's own word.
NATURAL_ENDINGS = TEACHER_NATURAL_ENDINGS


@dataclass(frozen=True)
class RenderedCall:
    conversation: Conversation
    prompt_text: str
    answer_text: str  # the text of answer_ids
    answer_ids: list[int]  # trained: the answer through its end-of-turn token


class Inexpressible(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason


@dataclass
class RenderReport:
    calls: int = 0
    rendered: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    breaks: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)  # one detail per skip reason

    def add(self, other: RenderReport) -> None:
        self.calls += other.calls
        self.rendered += other.rendered
        self.skipped.update(other.skipped)
        self.breaks.update(other.breaks)
        for reason, detail in other.examples.items():
            self.examples.setdefault(reason, detail)


def _arguments(value: Any) -> Any:
    """Tool-call arguments as a JSON value, whichever way they were serialized."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def recorded_reasoning(answer: dict[str, Any], formats: ModelFormats) -> tuple[str, str]:
    """The reasoning and content (stripped) of a recorded answer. Reasoning written in its text, in the
    student's own tags (``<think>…</think>``: what the gateway's chat API answers a Qwen3 policy's call
    with, and a vLLM teacher without a reasoning parser), is read as reasoning, as the student's
    parser reads it: taken as text, every such answer failed the check (``reasoning_dropped``) though
    the student renders it token for token, and only the turns without reasoning trained."""
    content = answer.get("content") or ""
    reasoning = (answer.get("reasoning_content") or "").strip()
    if not reasoning:
        inline, rest = split_reasoning(content, formats.reasoning_parser)
        if inline and inline.strip():
            return inline.strip(), rest.strip()
    return reasoning, content.strip()


def check_expressed(
    answer: dict[str, Any], text: str, formats: ModelFormats, prompt_text: str, tools: Any
) -> None:
    """Raise ``Inexpressible`` unless ``text`` (the student's answer, end-of-turn removed) parses
    back to ``answer`` with the student's reasoning and tool-call parsers."""
    opens = get_reasoning_parser(formats.reasoning_parser).prompt_opens_reasoning(prompt_text[-64:])
    reasoning, content = split_reasoning(text, formats.reasoning_parser, starts_in_reasoning=opens)
    parsed = parse_tool_calls(content, formats.tool_parser, tools)
    want_reasoning, want_content = recorded_reasoning(answer, formats)
    if (reasoning or "").strip() != want_reasoning:
        raise Inexpressible(
            "reasoning_dropped", f"reasoning {want_reasoning[:60]!r} is not in {text[:120]!r}"
        )
    want_calls = [
        (c["function"]["name"], _arguments(c["function"]["arguments"])) for c in answer.get("tool_calls", [])
    ]
    got_calls = [(c.name, _arguments(c.arguments)) for c in parsed.tool_calls]
    if got_calls != want_calls:
        raise Inexpressible("tool_calls_lost", f"tool calls {want_calls!r} read back as {got_calls!r}")
    if (parsed.content or "").strip() != want_content:
        raise Inexpressible(
            "content_changed", f"content {answer.get('content', '')[:60]!r} read back differently"
        )


def _messages_thinking(tokenizer: PolicyTokenizer, thinking: Any, tools: Any) -> dict[str, Any]:
    """A Messages request's ``thinking`` as the gateway turns it into the template's switch."""
    if thinking is None:
        return {}
    try:
        param = ThinkingParam.model_validate(thinking)
    except ValidationError:
        return {}  # the gateway refused such a request: it was never recorded
    return thinking_template_kwargs(tokenizer, param, tools)


def request_template_kwargs(conv: Conversation, tokenizer: PolicyTokenizer) -> dict[str, Any]:
    """The template variables the gateway renders ``conv``'s request with for ``tokenizer``: a chat
    call's ``chat_template_kwargs``; a Messages call's ``thinking`` and a Responses call's
    ``reasoning.effort`` as the template's thinking switch, where it has one."""
    request = conv.call.request
    if conv.call.api == "messages":
        return _messages_thinking(tokenizer, request.get("thinking"), conv.tools)
    if conv.call.api == "responses":
        reasoning = request.get("reasoning")
        try:
            return thinking_kwargs(tokenizer, reasoning if isinstance(reasoning, dict) else None)
        except ConfigError:
            return {}  # no template: rendering reports it
    return conv.template_kwargs


def _is_empty(answer: dict[str, Any]) -> bool:
    return not (
        (answer.get("content") or "").strip()
        or (answer.get("reasoning_content") or "").strip()
        or answer.get("tool_calls")
    )


def answer_skip(conv: Conversation) -> Inexpressible | None:
    """Why ``conv``'s answer is never training data whatever the template (``truncated``,
    ``empty_answer``), or None; shared by training (``render_call``) and the export."""
    finish = conv.call.finish_reason
    if finish not in NATURAL_ENDINGS:
        # The template would close the cut answer with an end-of-turn: teaching to stop mid-answer.
        detail = "the answer hit its token limit" if finish == "length" else f"the answer ended by {finish!r}"
        return Inexpressible("truncated", detail)
    if _is_empty(conv.answer):
        return Inexpressible(
            "empty_answer", "no text, reasoning or tool call: it would teach stopping at once"
        )
    return None


def render_call(
    conv: Conversation,
    tokenizer: PolicyTokenizer,
    formats: ModelFormats,
    template_kwargs: Mapping[str, Any] | None = None,
) -> RenderedCall:
    """``conv`` in the student's tokens; ``Inexpressible`` with the reason if it cannot be.
    ``template_kwargs`` (``sft.chat_template_kwargs``) are the template's variables, under those
    the gateway derives from the request (``request_template_kwargs``)."""
    skipped = answer_skip(conv)
    if skipped is not None:
        raise skipped
    kwargs = {**(template_kwargs or {}), **request_template_kwargs(conv, tokenizer)}
    try:
        prompt_text = tokenizer.render_chat(conv.messages, conv.tools, add_generation_prompt=True, **kwargs)
        full_text = tokenizer.render_chat(
            [*conv.messages, conv.answer], conv.tools, add_generation_prompt=False, **kwargs
        )
    except BadRequest as exc:
        raise Inexpressible("template_error", str(exc)) from exc
    if not full_text.startswith(prompt_text):
        raise Inexpressible("prefix_mismatch", "the prompt does not render as a prefix of prompt + answer")
    ids = tokenizer.encode(full_text[len(prompt_text) :])
    stops = set(tokenizer.stop_token_ids)
    end = next((i + 1 for i, t in enumerate(ids) if t in stops), len(ids))
    answer_ids = ids[:end]  # what follows the end-of-turn token is template glue: context
    if not answer_ids:
        raise Inexpressible("empty_answer")
    sampled = answer_ids[:-1] if answer_ids[-1] in stops else answer_ids
    check_expressed(conv.answer, tokenizer.decode(sampled), formats, prompt_text, conv.tools)
    return RenderedCall(conv, prompt_text, tokenizer.decode(answer_ids), answer_ids)


class PromptBuilder:
    """Prompt IDs as the gateway builds them when it serves the student
    (``gateway.prompt.conversation.build_prompt``, its reference path): where a call's history
    continues an earlier rendered call (its messages and answer, matched as the gateway matches
    them), that call's prompt + answer IDs are reused and only the rest is encoded. The gateway keeps
    the sampled turn even where the template would render it otherwise with more turns after it
    (Qwen3 drops the reasoning of turns before the last user message): so does this, or the student
    would be trained behind prompts the gateway never sends it."""

    def __init__(self, tokenizer: PolicyTokenizer) -> None:
        self.tokenizer = tokenizer
        self._priors: list[PriorCall] = []

    def prompt_ids(self, rendered: RenderedCall, kwargs: Mapping[str, Any]) -> list[int]:
        conv = rendered.conversation
        tools = self.tokenizer.template_tools(conv.tools)
        plan = build_prompt(
            self.tokenizer,
            conv.messages,
            self._priors,
            tools=tools,
            template_kwargs=dict(kwargs),
            incremental=False,
        )
        self._priors.append(
            PriorCall.from_keys(
                conv.keys()[:-1],
                conv.answer,
                plan.prompt_ids,
                rendered.answer_ids,
                prompt_template_key(self.tokenizer, tools, dict(kwargs)),
            )
        )
        return plan.prompt_ids


def rollout_sequences(
    rollout: Rollout,
    calls: Sequence[Call],
    tokenizer: PolicyTokenizer,
    formats: ModelFormats,
    *,
    max_sample_tokens: int | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[list[Sample], RenderReport]:
    """The training sequences of one rollout (loss mask 1 on the answers) and what was skipped."""
    report = RenderReport()
    prompts = PromptBuilder(tokenizer)
    token_calls: list[Call] = []

    def skip(call: Call, exc: NoConversation | Inexpressible) -> None:
        report.skipped[exc.reason] += 1
        report.examples.setdefault(exc.reason, f"rollout {rollout.rollout_id} call {call.seq}: {exc}")

    conversations: list[Conversation] = []
    for call in final_calls(rollout, calls):
        report.calls += 1
        try:
            conversations.append(conversation(call))
        except NoConversation as exc:
            skip(call, exc)
    for conv in with_recorded_answers(conversations):
        kwargs = {**(template_kwargs or {}), **request_template_kwargs(conv, tokenizer)}
        try:
            rendered = render_call(conv, tokenizer, formats, template_kwargs)
            prompt_ids = prompts.prompt_ids(rendered, kwargs)
        except Inexpressible as exc:
            skip(conv.call, exc)
            continue
        except BadRequest as exc:  # the template refused a render of the history the gateway makes
            skip(conv.call, Inexpressible("template_error", str(exc)))
            continue
        report.rendered += 1
        token_calls.append(
            Call(
                rollout_id=rollout.rollout_id,
                seq=conv.call.seq,
                attempt=rollout.attempt,
                prompt_token_ids=prompt_ids,
                response_token_ids=rendered.answer_ids,
                response_logprobs=[0.0] * len(rendered.answer_ids),
            )
        )
    # calls_seen was applied above (final_calls), before skipped calls changed the count.
    metadata = {k: v for k, v in rollout.metadata.items() if k != CALLS_SEEN_KEY}
    built = build_rollout_samples(
        rollout.model_copy(update={"metadata": metadata}), token_calls, max_sample_tokens=max_sample_tokens
    )
    report.breaks.update(built.breaks)
    if built.oversized_calls:
        report.skipped["too_long"] += built.oversized_calls
    for sample in built.samples:
        sample.advantage = 1.0  # the packing helpers' weight; the SFT loss is a plain token mean
    return built.samples, report
