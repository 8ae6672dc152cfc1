"""Rendering recorded teacher calls with the student's template: loss on exactly the answer tokens,
chains as the RL builder makes them, answers the template cannot express counted and skipped."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harnessrl.gateway.parsers.formats import resolve_formats
from harnessrl.gateway.prompt.messages import normalize_message, normalize_messages
from harnessrl.schemas import Call, Rollout, RolloutStatus
from harnessrl.sft.render import rollout_sequences
from harnessrl.tokenizer import PolicyTokenizer

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def formats(tokenizer: PolicyTokenizer):
    return resolve_formats("auto", "auto", tokenizer.chat_template)


def rollout() -> Rollout:
    return Rollout(rollout_id="r", api_key="k", status=RolloutStatus.FINISHED, reward=1.0)


def chat_calls(
    answers: list[dict[str, Any]], user: str = "Fix the bug.", *, resend_reasoning: bool = True
) -> list[Call]:
    """The calls a harness that only appends to its history makes, answered with ``answers``;
    ``resend_reasoning=False``: it resends them without ``reasoning_content``, as most chat clients."""
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": user},
    ]
    calls = []
    for seq, answer in enumerate(answers):
        calls.append(
            Call(
                rollout_id="r",
                seq=seq,
                request={"messages": [dict(m) for m in history], "tools": TOOLS},
                response={"role": "assistant", **answer},
                prompt_token_ids=[0],
                response_token_ids=[],
                response_logprobs=[],
            )
        )
        kept = {k: v for k, v in answer.items() if resend_reasoning or k != "reasoning_content"}
        history.append({"role": "assistant", **kept})
        for j, _ in enumerate(answer.get("tool_calls", [])):
            history.append({"role": "tool", "tool_call_id": f"c{seq}{j}", "content": f"output {seq}"})
        if not answer.get("tool_calls"):
            history.append({"role": "user", "content": "Go on."})
    return calls


def reference_answer_ids(tokenizer: PolicyTokenizer, call: Call) -> list[int]:
    """The reference: the template's rendering of the answer after the generation prompt, through
    the first end-of-turn token, encoded; messages normalized as the gateway renders them (tool-call
    arguments as JSON objects)."""
    messages = normalize_messages(call.request["messages"])
    answer = normalize_message(dict(call.response))
    prompt = tokenizer.render_chat(messages, TOOLS, add_generation_prompt=True)
    whole = tokenizer.render_chat([*messages, answer], TOOLS, add_generation_prompt=False)
    text = whole[len(prompt) :]
    return tokenizer.encode(text[: text.index("<|im_end|>") + len("<|im_end|>")])


def test_a_recorded_tool_calling_rollout_is_one_sequence(record, tokenizer, solving):
    rec = record([solving], [1.0])
    r = rec.store.get_rollout(rec.rollout_ids[0])
    samples, report = rollout_sequences(r, rec.store.list_calls(r.rollout_id), tokenizer, formats(tokenizer))
    assert (report.calls, report.rendered, dict(report.skipped)) == (2, 2, {})
    assert len(samples) == 1, report.breaks
    sample = samples[0]
    trained = [tokenizer.decode(sample.input_ids[s.start : s.end]) for s in sample.spans]
    assert trained == [
        'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "cat a.txt"}}\n</tool_call><|im_end|>',
        "The answer is 42.<|im_end|>",
    ]
    # between the answers: the template's glue and the tool output, all context
    between = tokenizer.decode(sample.input_ids[sample.spans[0].end : sample.spans[1].start])
    assert "<tool_response>\n42\n\n</tool_response>" in between and between.endswith(
        "<|im_start|>assistant\n"
    )
    assert sum(sample.loss_mask) == sum(s.end - s.start for s in sample.spans)


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_calls_through_the_other_apis_render_as_the_same_sequence(record, tokenizer, solving, api, tmp_path):
    """A teacher recorded through the Anthropic Messages or the Responses API trains the student
    on the same answer tokens as through chat completions (the prompts differ only where the APIs
    do: the order of a tool's fields in the tools header)."""
    chat = record([solving], [1.0], run_dir=tmp_path / "chat")
    other = record([solving], [1.0], run_dir=tmp_path / api, api=api)

    def trained(rec):
        r = rec.store.get_rollout(rec.rollout_ids[0])
        samples, report = rollout_sequences(
            r, rec.store.list_calls(r.rollout_id), tokenizer, formats(tokenizer)
        )
        assert report.rendered == 2 and not report.skipped, report
        assert len(samples) == 1
        return [s.input_ids[span.start : span.end] for s in samples for span in s.spans]

    assert {c.api for c in other.store.list_calls(other.rollout_ids[0])} == {api}
    assert trained(other) == trained(chat)


def test_an_answer_the_template_cannot_express_is_counted_and_skipped(tokenizer):
    answers = [
        {
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "c00",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                }
            ],
        },
        # the tiny student's template has no place for reasoning: training on it without would
        # teach the answer without the thinking that led to it
        {"content": "Done.", "reasoning_content": "the listing shows it"},
        # literal tool-call markup in the text would read back as a tool call
        {"content": 'Write <tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call> to call.'},
        {"content": "Bye."},
    ]
    samples, report = rollout_sequences(rollout(), chat_calls(answers), tokenizer, formats(tokenizer))
    assert report.calls == 4 and report.rendered == 2
    assert dict(report.skipped) == {"reasoning_dropped": 1, "tool_calls_lost": 1}
    trained = [tokenizer.decode(s.input_ids[sp.start : sp.end]) for s in samples for sp in s.spans]
    assert trained[0].startswith("Looking.") and trained[-1] == "Bye.<|im_end|>"
    assert not any("reasoning" in t or "Write" in t for t in trained)


def test_an_answer_cut_at_its_token_limit_is_not_closed_and_trained(tokenizer):
    calls = chat_calls([{"content": "The answer is"}, {"content": "42."}])
    calls[0] = calls[0].model_copy(update={"finish_reason": "length"})
    samples, report = rollout_sequences(rollout(), calls, tokenizer, formats(tokenizer))
    assert dict(report.skipped) == {"truncated": 1} and report.rendered == 1
    assert [tokenizer.decode(s.input_ids[sp.start : sp.end]) for s in samples for sp in s.spans] == [
        "42.<|im_end|>"
    ]


@pytest.mark.parametrize("finish", ["content_filter", "error", "abort"])
def test_only_an_answer_that_ended_naturally_is_trained(tokenizer, finish):
    """Teacher mode records the upstream's finish reason as it came: an answer a content filter cut
    (partial text) would be closed with an end-of-turn as a finished one; any ending but the
    natural ones (``stop``, ``tool_calls``) counts as truncated."""
    calls = chat_calls(
        [
            {"content": "Partial"},
            {
                "content": "Looking.",
                "tool_calls": [
                    {"id": "c10", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
                ],
            },
            {"content": "42."},
        ]
    )
    calls[0] = calls[0].model_copy(update={"finish_reason": finish})
    calls[1] = calls[1].model_copy(update={"finish_reason": "tool_calls"})
    samples, report = rollout_sequences(rollout(), calls, tokenizer, formats(tokenizer))
    assert dict(report.skipped) == {"truncated": 1} and report.rendered == 2
    assert repr(finish) in report.examples["truncated"]
    trained = [tokenizer.decode(s.input_ids[sp.start : sp.end]) for s in samples for sp in s.spans]
    assert trained[0].startswith("Looking.") and trained[-1] == "42.<|im_end|>"


def test_an_empty_answer_is_not_trained_as_stopping_at_once(tokenizer):
    """An answer with no text, reasoning or tool call (an upstream that answered nothing) would teach
    the student to end its turn at once: counted and skipped. The rollout's other calls still
    train, as one sequence."""
    calls = chat_calls([{"content": "Looking."}, {"content": "  "}, {"content": "42."}])
    samples, report = rollout_sequences(rollout(), calls, tokenizer, formats(tokenizer))
    assert dict(report.skipped) == {"empty_answer": 1} and report.rendered == 2
    assert "call 1: no text, reasoning or tool call" in report.examples["empty_answer"]
    assert [tokenizer.decode(s.input_ids[sp.start : sp.end]) for s in samples for sp in s.spans] == [
        "Looking.<|im_end|>",
        "42.<|im_end|>",
    ]
    assert len(samples) == 1, report.breaks


def test_a_turn_resent_without_its_reasoning_is_trained_on_as_recorded():
    """A chat client that drops ``reasoning_content`` when it resends a turn: the gateway serving the
    student reuses the turn's sampled tokens, reasoning included, so the next call's prompt holds the
    recorded answer (one chain), as the export's line does."""
    student = family_student("qwen3")
    answers = teacher_answers(True)
    samples, report = rollout_sequences(
        rollout(), chat_calls(answers, resend_reasoning=False), student, formats(student)
    )
    assert (report.rendered, dict(report.skipped)) == (2, {}), report.examples
    assert len(samples) == 1, report.breaks
    (sample,) = samples
    context = student.decode(sample.input_ids[sample.spans[0].end : sample.spans[1].start])
    trained = [student.decode(sample.input_ids[sp.start : sp.end]) for sp in sample.spans]
    assert "The file should say it." in trained[0] and "The tool printed 42." in trained[1]
    assert "<tool_response>" in context  # between the answers only context, no second copy
    assert student.decode(sample.input_ids).count("The file should say it.") == 1


def test_a_raw_completion_has_no_conversation(tokenizer):
    call = Call(
        rollout_id="r",
        seq=0,
        api="completions",
        request={"prompt": "x"},
        response={"text": "y"},
        prompt_token_ids=[1],
        response_token_ids=[2],
        response_logprobs=[0.0],
    )
    samples, report = rollout_sequences(rollout(), [call], tokenizer, formats(tokenizer))
    assert samples == [] and dict(report.skipped) == {"raw_completion": 1}


# -- the property: loss masks cover exactly the answer tokens -----------------------------------------
_TEXT = st.text(
    alphabet=st.sampled_from(list("abcxyz XYZ019.,:;!?()[]{}'\"\n\t-_/\\") + ["é", "世", "😀"]),
    min_size=0,
    max_size=24,
)
_ARGS = st.dictionaries(
    st.sampled_from(["command", "path", "n"]), st.one_of(_TEXT, st.integers(-5, 99)), max_size=2
)


@st.composite
def answers(draw: Any) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(1, 4))):
        content = draw(_TEXT)
        calls = [
            {
                "id": f"c{i}{j}",
                "type": "function",
                "function": {"name": "bash", "arguments": json.dumps(args)},
            }
            for j, args in enumerate(draw(st.lists(_ARGS, max_size=2)))
        ]
        answer: dict[str, Any] = {"content": content}
        if calls:
            answer["tool_calls"] = calls
        if draw(st.booleans()) and draw(st.booleans()):
            answer["reasoning_content"] = draw(_TEXT)
        out.append(answer)
    return out


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(answers(), _TEXT)
def test_loss_masks_cover_exactly_the_answer_tokens(tokenizer, drawn, user):
    calls = chat_calls(drawn, user=user or "?")
    samples, report = rollout_sequences(rollout(), calls, tokenizer, formats(tokenizer))
    assert report.rendered + sum(report.skipped.values()) == len(calls)
    by_seq = {c.seq: c for c in calls}
    trained_calls = []
    for sample in samples:
        assert len(sample.loss_mask) == len(sample.input_ids)
        in_spans = [0] * len(sample.input_ids)
        for span in sample.spans:
            in_spans[span.start : span.end] = [1] * (span.end - span.start)
            # each span is exactly that call's answer as the student's template writes it
            assert sample.input_ids[span.start : span.end] == reference_answer_ids(
                tokenizer, by_seq[span.call_seq]
            )
            trained_calls.append(span.call_seq)
        assert sample.loss_mask == in_spans  # and nothing else carries loss
    assert len(trained_calls) == len(set(trained_calls)) == report.rendered
    if not report.skipped:  # an append-only history renders as one exact-prefix chain
        assert len(samples) == 1, report.breaks
    # reasoning is never trained on by a student whose template drops it
    for seq in trained_calls:
        assert not (by_seq[seq].response.get("reasoning_content") or "").strip()


# -- other students: the same teacher answers in each family's own formats ----------------------------
FAMILY_MARKERS = {
    "qwen3": ("<think>", '<tool_call>\n{"name": "bash"'),
    "qwen3.6": ("</think>", "<function=bash>"),
    "deepseek": (None, "<｜tool▁call▁begin｜>bash<｜tool▁sep｜>"),
}


def teacher_answers(reasoning: bool) -> list[dict[str, Any]]:
    call = {
        "id": "c00",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command": "cat a.txt"}'},
    }
    answers: list[dict[str, Any]] = [
        {"content": "Let me look.", "tool_calls": [call]},
        {"content": "It says 42."},
    ]
    if reasoning:
        answers[0]["reasoning_content"] = "The file should say it."
        answers[1]["reasoning_content"] = "The tool printed 42."
    return answers


@pytest.mark.parametrize("family", sorted(FAMILY_MARKERS))
def test_reasoning_and_tool_calls_train_in_the_students_own_format(family):
    """Qwen3 (Hermes JSON, <think>) and Qwen3.6 (XML calls, thinking opened by the prompt) students
    learn the teacher's reasoning and tool calls in their own format. DeepSeek V3.1's template renders
    no reasoning in an assistant turn (its history drops it, with or without ``thinking``), so
    reasoning answers are counted and skipped, and the same answers without reasoning train."""
    from harnessrl.engines.tiny_families import family_available, tiny_family_dir

    if (why := family_available(family)) is not None:
        pytest.skip(why)
    student = PolicyTokenizer.from_dir(tiny_family_dir(family, weights=False))
    reasoning_marker, call_marker = FAMILY_MARKERS[family]
    if reasoning_marker is None:
        for kwargs in ({}, {"thinking": True}):
            samples, report = rollout_sequences(
                rollout(),
                chat_calls(teacher_answers(True)),
                student,
                formats(student),
                template_kwargs=kwargs,
            )
            assert samples == [] and report.rendered == 0 and sum(report.skipped.values()) == 2, (
                report.skipped
            )
    samples, report = rollout_sequences(
        rollout(), chat_calls(teacher_answers(reasoning_marker is not None)), student, formats(student)
    )
    assert (report.rendered, dict(report.skipped)) == (2, {}), report.examples
    assert len(samples) == 1, report.breaks
    trained = [student.decode(s.input_ids[sp.start : sp.end]) for s in samples for sp in s.spans]
    assert call_marker in trained[0] and "cat a.txt" in trained[0] and "It says 42." in trained[1]
    if reasoning_marker is not None:
        assert "The file should say it." in trained[0] and reasoning_marker in trained[0]
        assert "The tool printed 42." in trained[1]
    for sample in samples:  # nothing but the answers carries loss
        spans = [0] * len(sample.input_ids)
        for sp in sample.spans:
            spans[sp.start : sp.end] = [1] * (sp.end - sp.start)
        assert sample.loss_mask == spans


# -- the student's prompt is the gateway's: the thinking switch of each API ----------------------------
THINKING_CASES = {
    "messages, thinking disabled": ("/messages", {"max_tokens": 64, "thinking": {"type": "disabled"}}),
    "messages, thinking enabled": ("/messages", {"max_tokens": 64, "thinking": {"type": "enabled"}}),
    "responses, effort minimal": ("/responses", {"reasoning": {"effort": "minimal"}}),
    "responses, effort high": ("/responses", {"reasoning": {"effort": "high"}}),
    "chat, enable_thinking false": (
        "/chat/completions",
        {"chat_template_kwargs": {"enable_thinking": False}},
    ),
}


def family_student(family: str) -> PolicyTokenizer:
    from harnessrl.engines.tiny_families import family_available, tiny_family_dir

    if (why := family_available(family)) is not None:
        pytest.skip(why)
    return PolicyTokenizer.from_dir(tiny_family_dir(family, weights=False))


def served(
    tmp_path, student: PolicyTokenizer, path: str, extra: dict[str, Any]
) -> tuple[Rollout, list[Call]]:
    """One call through a real gateway serving ``student`` (scripted): the rollout and its calls."""
    import httpx

    from harnessrl.client import GatewayClient
    from harnessrl.config import GatewayConfig
    from harnessrl.engines.scripted import ScriptedEngine
    from harnessrl.gateway import create_app
    from harnessrl.gateway.server import serve_in_thread
    from harnessrl.schemas import Outcome
    from harnessrl.store.sqlite import SQLiteStore

    question = (
        {"input": "What is 6 x 7?"}
        if path == "/responses"
        else {"messages": [{"role": "user", "content": "What is 6 x 7?"}]}
    )
    store = SQLiteStore(tmp_path / "gateway.db")
    try:
        app = create_app(
            GatewayConfig(admin_key="admin"), store, ScriptedEngine([{"content": "42."}], student)
        )
        with serve_in_thread(app) as url, GatewayClient(url, "admin") as client:
            created = client.create_rollout({"prompt": "6 x 7"}, run_id="teacher", task_id="t")
            key = created["api_key"]
            reply = httpx.post(
                created["base_url"] + path,
                json={"model": "m", **question, **extra},
                headers={"Authorization": f"Bearer {key}", "x-api-key": key},
                timeout=30,
            )
            reply.raise_for_status()
        store.finish_rollout(created["rollout_id"], Outcome.SUCCESS, 1.0)
        return store.get_rollout(created["rollout_id"]), store.list_calls(created["rollout_id"])
    finally:
        store.close()


@pytest.mark.parametrize("case", sorted(THINKING_CASES))
def test_the_students_prompt_is_the_one_the_gateway_sends_it(tmp_path, case):
    """docs/sft.md: the prompt is what the gateway would send the student's engine for the request,
    so Anthropic ``thinking`` and Responses ``reasoning.effort`` switch the template's thinking as the
    gateway switches it (Qwen3.6's prompt closes an empty ``<think>`` block when it is off)."""
    student = family_student("qwen3.6")
    path, extra = THINKING_CASES[case]
    rollout, calls = served(tmp_path, student, path, extra)
    (call,) = calls
    samples, report = rollout_sequences(rollout, calls, student, formats(student))
    assert (report.rendered, dict(report.skipped)) == (1, {}), report.examples
    (sample,) = samples
    prompt = sample.input_ids[: sample.spans[0].start]
    off = "disabled" in case or "minimal" in case or "false" in case
    assert student.decode(call.prompt_token_ids).endswith("<think>\n\n</think>\n\n" if off else "<think>\n")
    assert prompt == call.prompt_token_ids


def test_a_template_that_cannot_write_the_answer_after_that_prompt_skips_it(tmp_path):
    """The tiny Qwen3 template closes an empty block in a thinking-off prompt but writes the answer's
    turn without it: the call is counted and skipped, never trained behind a prompt the gateway
    did not send (thinking on, the control, trains)."""
    student = family_student("qwen3")
    for thinking, trained in (("disabled", 0), ("enabled", 1)):
        body = {"max_tokens": 64, "thinking": {"type": thinking}}
        rollout, calls = served(tmp_path / thinking, student, "/messages", body)
        samples, report = rollout_sequences(rollout, calls, student, formats(student))
        assert report.rendered == trained, report
        if trained:
            assert samples[0].input_ids[: samples[0].spans[0].start] == calls[0].prompt_token_ids
        else:
            assert dict(report.skipped) == {"prefix_mismatch": 1} and samples == []
