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


def chat_calls(answers: list[dict[str, Any]], user: str = "Fix the bug.") -> list[Call]:
    """The calls a harness that only appends to its history makes, answered with ``answers``."""
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
        history.append({"role": "assistant", **answer})
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
