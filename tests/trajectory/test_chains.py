"""Chain building on synthetic call sequences, plus property tests of the builder's invariants."""

from __future__ import annotations

import math
import sys
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harnessrl.errors import InvalidBatch
from harnessrl.schemas import Call, Rollout
from harnessrl.token_ids import common_prefix
from harnessrl.trajectory import Sample, build_rollout_samples, calls_to_samples

SYSTEM = [1, 2, 3]  # a shared "system prompt"


def rollout(rollout_id: str = "r", attempt: int = 0, reward: float = 1.0) -> Rollout:
    return Rollout(rollout_id=rollout_id, api_key="k", task_id="t", step=0, attempt=attempt, reward=reward)


class Calls:
    """Builds a call sequence; ``seq`` counts up like the store assigns it."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def add(
        self, prompt: list[int], response: list[int], *, version: int = 0, attempt: int = 0, **kw
    ) -> list[int]:
        seq = len(self.calls)
        self.calls.append(
            Call(
                rollout_id="r",
                seq=seq,
                attempt=attempt,
                prompt_token_ids=prompt,
                response_token_ids=response,
                response_logprobs=[-(seq + 1) / 10 - i / 1000 for i in range(len(response))],
                policy_version=version,
                **kw,
            )
        )
        return prompt + response  # the chain so far, for the next prompt


def check_sample_against_calls(sample: Sample, calls: list[Call]) -> None:
    """Reference: a sample is context everywhere except exactly its calls' responses."""
    expected_mask = [0] * len(sample)
    expected_lp = [0.0] * len(sample)
    for span in sample.spans:
        call = next(c for c in calls if c.seq == span.call_seq)
        assert sample.input_ids[: span.start] == call.prompt_token_ids
        assert sample.input_ids[span.start : span.end] == call.response_token_ids
        assert span.policy_version == call.policy_version
        expected_mask[span.start : span.end] = [1] * (span.end - span.start)
        expected_lp[span.start : span.end] = call.response_logprobs
    assert sample.loss_mask == expected_mask
    assert sample.behaviour_logprobs == expected_lp


def test_append_only_is_one_sample():
    c = Calls()
    h = c.add(SYSTEM + [10, 11], [20, 21, 22], version=3)
    h = c.add(h + [30, 31], [40, 41], version=3)  # tool output 30 31, then the next response
    c.add(h + [50], [60, 61, 62], version=4)
    built = build_rollout_samples(rollout(), c.calls)
    assert len(built.samples) == 1 and not built.breaks
    (s,) = built.samples
    assert s.input_ids == SYSTEM + [10, 11, 20, 21, 22, 30, 31, 40, 41, 50, 60, 61, 62]
    assert s.loss_mask == [0] * 5 + [1] * 3 + [0, 0] + [1, 1] + [0] + [1] * 3
    assert s.policy_versions() == [-1] * 5 + [3] * 3 + [-1, -1] + [3, 3] + [-1] + [4] * 3
    assert (s.rollout_id, s.reward, s.group_id, s.sample_index) == ("r", 1.0, "t@0", 0)
    check_sample_against_calls(s, c.calls)


def test_history_edit_starts_a_second_sample():
    c = Calls()
    h = c.add(SYSTEM + [10], [20, 21])
    h = c.add(h + [30, 31, 32], [40])
    # the harness rewrote the first tool output (30 31 32 -> 30 99) before the third call
    c.add(SYSTEM + [10, 20, 21, 30, 99, 40, 33], [50])
    built = build_rollout_samples(rollout(), c.calls)
    assert len(built.samples) == 2
    assert dict(built.breaks) == {"history_edited": 1}
    for s in built.samples:
        check_sample_against_calls(s, c.calls)
    assert [sp.call_seq for sp in built.samples[1].spans] == [2]


def test_subagent_interleaved_forms_its_own_chain_and_main_continues():
    c = Calls()
    main = c.add(SYSTEM + [10], [20])  # main agent
    sub = c.add([7, 7, 8], [70])  # subagent: another conversation
    main = c.add(main + [30], [40])  # main continues
    sub = c.add(sub + [71], [72])  # subagent continues
    c.add(main + [50], [60])  # main again
    built = build_rollout_samples(rollout(), c.calls)
    assert len(built.samples) == 2
    assert dict(built.breaks) == {"new_context": 1}
    main_s, sub_s = built.samples
    assert [sp.call_seq for sp in main_s.spans] == [0, 2, 4]
    assert [sp.call_seq for sp in sub_s.spans] == [1, 3]
    for s in built.samples:
        check_sample_against_calls(s, c.calls)


def test_subagent_sharing_the_system_prompt_is_new_context():
    c = Calls()
    c.add(SYSTEM + [10, 11], [20])
    c.add(SYSTEM + [12], [21])
    assert dict(build_rollout_samples(rollout(), c.calls).breaks) == {"new_context": 1}


def test_a_prompt_that_keeps_no_sampled_token_is_new_context_after_an_empty_first_answer():
    """The chain's first answer sampled nothing: a prompt diverging after that call's prompt but
    before the next answer keeps no sampled token (it was counted ``history_edited``)."""
    c = Calls()
    c.add([1, 2, 3], [])
    c.add([1, 2, 3, 7, 8], [20, 21])
    c.add([1, 2, 3, 9, 9], [30])
    assert dict(build_rollout_samples(rollout(), c.calls).breaks) == {"new_context": 1}


def test_longest_chain_wins():
    c = Calls()
    h1 = c.add(SYSTEM, [20])
    h2 = c.add(h1 + [30], [40])  # extends chain 0
    c.add(SYSTEM + [20, 30, 40, 5], [6])  # extends chain 0 (h2), the longest
    built = build_rollout_samples(rollout(), c.calls)
    assert len(built.samples) == 1
    assert built.samples[0].input_ids == h2 + [5, 6]


def test_identical_prompt_retried_keeps_both_and_continues_the_retry():
    c = Calls()
    h = c.add(SYSTEM + [10], [20, 21])
    first = c.add(h + [30], [40, 41])  # the harness discards this answer ...
    retry = c.add(h + [30], [42])  # ... and re-sends the identical request
    c.add(retry + [50], [60])  # the conversation continues from the retry
    built = build_rollout_samples(rollout(), c.calls)
    assert dict(built.breaks) == {"retried": 1}
    assert len(built.samples) == 2
    original, retried = built.samples
    assert original.input_ids == first
    assert [sp.call_seq for sp in retried.spans] == [2, 3]
    # the responses before the retry are trained once (in the first sample), context in the second
    assert retried.loss_mask[: len(h)] == [0] * len(h)
    for s in built.samples:
        check_sample_against_calls(s, c.calls)


def test_identical_prompt_and_identical_response_continue_the_latest():
    c = Calls()
    a = c.add(SYSTEM, [20])
    b = c.add(SYSTEM, [20])
    assert a == b
    c.add(a + [30], [40])
    built = build_rollout_samples(rollout(), c.calls)
    assert [[sp.call_seq for sp in s.spans] for s in built.samples] == [[0], [1, 2]]


def test_retokenization_drift_inside_a_response_is_prefix_mismatch():
    c = Calls()
    h = c.add(SYSTEM, [20, 21, 22, 23])
    c.add(SYSTEM + [20, 99, 23] + [30], [40])  # "21 22" re-tokenized as "99"
    assert dict(build_rollout_samples(rollout(), c.calls).breaks) == {"prefix_mismatch": 1}
    del h


def test_rerendered_response_is_prefix_mismatch_but_replaced_response_is_history_edited():
    think = [90, 91, 92]
    answer = [20, 21, 22, 23, 24, 25, 26, 27, 28, 29]
    c = Calls()
    c.add(SYSTEM, think + answer)
    c.add(SYSTEM + answer + [30], [40])  # template dropped the <think> block of the earlier turn
    assert dict(build_rollout_samples(rollout(), c.calls).breaks) == {"prefix_mismatch": 1}

    c = Calls()
    c.add(SYSTEM, think + answer)
    c.add(SYSTEM + [80, 81] + [30], [40])  # the earlier answer was replaced by a summary
    assert dict(build_rollout_samples(rollout(), c.calls).breaks) == {"history_edited": 1}


def test_response_cut_by_length_still_chains():
    c = Calls()
    h = c.add(SYSTEM, [20, 21], finish_reason="length")
    c.add(h + [8, 30], [40])  # the template closes the unfinished turn (8), then a user turn
    built = build_rollout_samples(rollout(), c.calls)
    assert len(built.samples) == 1 and not built.breaks


def test_only_the_final_attempt_is_used():
    c = Calls()
    c.add(SYSTEM, [20], attempt=0)
    c.add([5, 5], [21], attempt=1)
    built = build_rollout_samples(rollout(attempt=1), c.calls)
    assert built.calls_other_attempts == 1 and built.calls_used == 1
    assert [sp.call_seq for sp in built.samples[0].spans] == [1]


def test_calls_are_taken_in_seq_order():
    c = Calls()
    h = c.add(SYSTEM, [20])
    c.add(h + [30], [40])
    samples = calls_to_samples(rollout(), list(reversed(c.calls)))
    assert len(samples) == 1


def test_length_limit_ends_the_chain_at_the_last_call_that_fits():
    c = Calls()
    h = c.add(SYSTEM, [20, 21])  # 5 tokens
    h = c.add(h + [30], [40, 41])  # 8 tokens
    big = c.add(h + [50, 51, 52], [60, 61])  # 13 tokens > 10: dropped, never cut
    c.add(big + [70], [80])  # 15 tokens: dropped too, same chain (one length break)
    c.add(h + [55], [56])  # 10 tokens: a branch that fits continues the chain
    c.add([9, 9], [8])  # a fresh conversation
    built = build_rollout_samples(rollout(), c.calls, max_sample_tokens=13)
    assert [[sp.call_seq for sp in s.spans] for s in built.samples] == [[0, 1, 2], [4], [5]]
    built = build_rollout_samples(rollout(), c.calls, max_sample_tokens=10)
    assert dict(built.breaks) == {"length": 1, "new_context": 1}
    assert [[sp.call_seq for sp in s.spans] for s in built.samples] == [[0, 1, 4], [5]]
    assert built.oversized_calls == 2 and built.oversized_tokens == 13 + 15
    assert all(len(s) <= 10 for s in built.samples)
    for s in built.samples:
        check_sample_against_calls(s, c.calls)


def test_call_longer_than_the_limit_is_dropped_not_truncated():
    c = Calls()
    c.add(SYSTEM, [20] * 10)
    built = build_rollout_samples(rollout(), c.calls, max_sample_tokens=5)
    assert built.samples == [] and built.oversized_calls == 1


def test_logprob_count_must_match_response():
    call = Call(
        rollout_id="r", seq=0, prompt_token_ids=[1], response_token_ids=[2, 3], response_logprobs=[-1.0]
    )
    with pytest.raises(InvalidBatch):
        calls_to_samples(rollout(), [call])


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_a_non_finite_logprob_is_refused_naming_the_call_and_token(bad):
    """A NaN behaviour logprob reached the loss: with the trainer proximal it made the importance
    weight, the gradient and then every weight of the policy NaN; with the behaviour proximal the
    step's loss NaN and the token silently untrained."""
    c = Calls()
    chain = c.add([7], [8, 9])
    c.add(chain + [4], [5, 6, 11])
    assert len(build_rollout_samples(rollout(), c.calls).samples) == 1  # finite logprobs: built
    c.calls[1].response_logprobs[2] = bad
    with pytest.raises(InvalidBatch, match=r"call 1 of rollout r: response token 2 has logprob -?(nan|inf)"):
        build_rollout_samples(rollout(), c.calls)


def test_a_call_with_an_empty_prompt_is_refused_naming_it():
    """Its first sampled token would sit at position 0 of its sample, which nothing predicts: it was
    counted in the rollout's loss normalizer but never trained (shared-prefix rows skip it), or
    scored from the previous sample's last token in a packed row."""
    c = Calls()
    c.add([7], [8])
    c.add([], [5, 6])
    with pytest.raises(InvalidBatch, match="call 1 of rollout r has an empty prompt"):
        build_rollout_samples(rollout(), c.calls)
    assert build_rollout_samples(rollout(), c.calls[:1]).samples[0].loss_mask == [0, 1]
    # A teacher's call (docs/sft.md) records no tokens at all: nothing sampled, nothing refused.
    teacher = Call(rollout_id="r", seq=1, prompt_token_ids=[], response_token_ids=[], response_logprobs=[])
    assert build_rollout_samples(rollout(), [c.calls[0], teacher]).calls_used == 2


def test_empty_responses_give_no_sample():
    c = Calls()
    c.add(SYSTEM, [])
    built = build_rollout_samples(rollout(), c.calls)
    assert built.samples == [] and built.empty_samples == 1


# -- properties ----------------------------------------------------------------------------------
@st.composite
def call_sequences(draw):
    """A rollout as a random program: each call extends an earlier call's history (maybe edited),
    or starts a fresh conversation."""
    tokens = st.lists(st.integers(0, 6), min_size=0, max_size=4)
    c = Calls()
    histories: list[list[int]] = []
    for _ in range(draw(st.integers(1, 8))):
        action = (
            draw(st.sampled_from(["extend", "extend", "fresh", "edit", "retry"])) if histories else "fresh"
        )
        if action == "fresh":
            prompt = draw(st.lists(st.integers(0, 6), min_size=1, max_size=4))
        else:
            base = draw(st.sampled_from(histories))
            if action == "extend":
                prompt = base + draw(tokens)
            elif action == "retry":
                prompt = c.calls[draw(st.integers(0, len(c.calls) - 1))].prompt_token_ids
            else:
                cut = draw(st.integers(0, len(base)))
                prompt = base[:cut] + draw(tokens) + [draw(st.integers(0, 6))]
        response = draw(st.lists(st.integers(0, 6), min_size=1, max_size=4))
        histories.append(c.add(prompt, response, version=draw(st.integers(0, 2))))
    return c.calls


@settings(max_examples=200)
@given(call_sequences(), st.one_of(st.none(), st.integers(2, 20)))
def test_every_call_is_trained_exactly_once_and_exactly(calls, limit):
    built = build_rollout_samples(rollout(), calls, max_sample_tokens=limit)
    fits = [c for c in calls if limit is None or len(c.prompt_token_ids) + len(c.response_token_ids) <= limit]
    assert built.oversized_calls == len(calls) - len(fits)
    seqs = [sp.call_seq for s in built.samples for sp in s.spans]
    assert sorted(seqs) == [c.seq for c in fits]
    assert sum(s.num_loss_tokens for s in built.samples) == sum(len(c.response_token_ids) for c in fits)
    for i, s in enumerate(built.samples):
        assert s.sample_index == i
        assert limit is None or len(s) <= limit
        assert len(s.input_ids) == len(s.loss_mask) == len(s.behaviour_logprobs)
        check_sample_against_calls(s, calls)
    breaks = sum(built.breaks.values())
    # every sample but the first was started by a break (length breaks may also precede a drop)
    assert len(built.samples) <= 1 + breaks


@settings(max_examples=100)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 9), max_size=4), st.lists(st.integers(0, 9), min_size=1, max_size=4)
        ),
        min_size=1,
        max_size=10,
    )
)
def test_append_only_sequences_are_one_sample(steps):
    c = Calls()
    history: list[int] = list(SYSTEM)
    for context, response in steps:
        history = c.add(history + context, response)
    built = build_rollout_samples(rollout(), c.calls)
    assert len(built.samples) == 1 and not built.breaks
    assert built.samples[0].input_ids == history


# -- the plain definition of matching and break reasons, and what finding chains costs -------------
def reference_build(calls: list[Call], limit: int | None) -> tuple[list[list[int]], Counter[str]]:
    """The chains (as call seqs) and break reasons by the plain definition: every call is compared
    with every chain, O(calls^2 x tokens)."""
    chains: list[dict] = []  # ids, spans [(start, end, response)], seqs, touched, capped
    breaks: Counter[str] = Counter()

    def shared(prompt: list[int], ids: list[int]) -> int:
        return next(
            (k for k, (a, b) in enumerate(zip(prompt, ids, strict=False)) if a != b),
            min(len(prompt), len(ids)),
        )

    def reason(prompt: list[int], chain: dict, p: int) -> str:
        if p == len(prompt):
            return "retried"
        if p < (chain["spans"][0][0] if chain["spans"] else len(chain["ids"])):
            return "new_context"
        for start, end, response in chain["spans"]:
            if start < p <= end:
                return "prefix_mismatch"
            if p == start:
                tail, window = response[-8:], prompt[p : p + len(response) + 16]
                rerendered = any(
                    window[i : i + len(tail)] == tail for i in range(len(window) - len(tail) + 1)
                )
                return "prefix_mismatch" if rerendered else "history_edited"
        return "history_edited"

    for order, call in enumerate(sorted(calls, key=lambda c: c.seq)):
        prompt, response = call.prompt_token_ids, call.response_token_ids
        extended = [c for c in chains if prompt[: len(c["ids"])] == c["ids"]]
        chain = max(extended, key=lambda c: (len(c["ids"]), c["touched"]), default=None)
        if limit is not None and len(prompt) + len(response) > limit:
            if chain is not None and not chain["capped"]:
                chain["capped"] = True
                breaks["length"] += 1
            continue
        if chain is None:
            if chains:
                best = max(chains, key=lambda c: (shared(prompt, c["ids"]), c["touched"]))
                breaks[reason(prompt, best, shared(prompt, best["ids"]))] += 1
            chain = {"ids": [], "spans": [], "seqs": [], "capped": False}
            chains.append(chain)
        chain["ids"] = list(prompt)
        if response:
            chain["spans"].append((len(prompt), len(prompt) + len(response), list(response)))
            chain["seqs"].append(call.seq)
        chain["ids"] += response
        chain["touched"] = order
    return [c["seqs"] for c in chains if c["seqs"]], breaks


@st.composite
def branching_call_sequences(draw):
    """Many calls over a tiny alphabet: chains that are prefixes of each other, equal chains,
    prompts branching off any chain at any depth, retried prompts and answers."""
    c = Calls()
    histories: list[list[int]] = []
    for _ in range(draw(st.integers(1, 20))):
        if histories and draw(st.booleans()):
            base = draw(st.sampled_from(histories))
            prompt = base[: draw(st.integers(0, len(base)))] + draw(st.lists(st.integers(0, 2), max_size=3))
        else:
            prompt = draw(st.lists(st.integers(0, 2), max_size=3))
        if not prompt:
            prompt = [0]
        histories.append(c.add(prompt, draw(st.lists(st.integers(0, 2), max_size=3))))
    return c.calls


@settings(max_examples=300)
@given(st.one_of(call_sequences(), branching_call_sequences()), st.one_of(st.none(), st.integers(2, 20)))
def test_chains_and_break_reasons_follow_the_plain_definition(calls, limit):
    built = build_rollout_samples(rollout(), calls, max_sample_tokens=limit)
    chains, breaks = reference_build(calls, limit)
    assert [[sp.call_seq for sp in s.spans] for s in built.samples] == chains
    assert built.breaks == breaks


def count_calls(function, run) -> int:
    """How many times ``run()`` calls the Python function ``function`` (by profiling, not patching)."""
    code, count, previous = function.__code__, 0, sys.getprofile()

    def profile(frame, event, arg):
        nonlocal count
        count += event == "call" and frame.f_code is code

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(previous)
    return count


def test_finding_chains_compares_a_prompt_with_a_few_chains_not_all_of_them():
    """Every call breaking the chain (a changing system prompt, a shared prefix with a new task each
    time) compared each prompt with every chain so far: n^2/2 prefix comparisons of the whole
    context per rollout (400 calls of 8 k tokens: 28 s), and the harness decides n."""
    n = 60
    changing_system = Calls()
    history = [50] * 20
    for i in range(n):
        history = changing_system.add([1, 2, 100 + i] + history, [60 + i % 7, 61]) + [70]
    shared_prefix = Calls()
    for i in range(n):
        shared_prefix.add(SYSTEM * 30 + [100 + i, 7], [8, 9])
    for c in (changing_system, shared_prefix):
        built = build_rollout_samples(rollout(), c.calls)
        assert len(built.samples) == n and built.breaks == {"new_context": n - 1}
        compared = count_calls(common_prefix, lambda c=c: build_rollout_samples(rollout(), c.calls))
        assert compared <= 4 * n, compared  # comparing with every chain made 1,829


def test_calls_sharing_nothing_are_classified_without_scanning_every_chain(monkeypatch):
    """A rollout whose prompts share no first token (each call a new chain): classifying each break
    scanned every chain for the latest touched, O(calls^2) per rollout (20k calls: 11 s on the
    trainer and the dashboard's trace page). Counted here by the chains' ``last_touched`` reads,
    not timed: a few per call now, one per chain per call before."""
    reads = count_last_touched_reads(monkeypatch)
    calls = Calls()
    n = 400
    for i in range(n):
        calls.add([1000 + i, 2], [5])
    result = build_rollout_samples(rollout(), calls.calls)
    assert len(result.samples) == n and sum(result.breaks.values()) == n - 1
    assert reads[0] <= 4 * n, reads[0]  # before: ~n^2 / 2 (80,000 here)


def count_last_touched_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every chain built from now on counts its ``last_touched`` reads into the returned one-item list:
    how the tests see the work of classifying breaks without timing it."""
    import harnessrl.trajectory.samples as samples_module

    reads = [0]

    class Counted(samples_module._Chain):
        def __getattribute__(self, name):  # noqa: ANN001, ANN204
            if name == "last_touched":
                reads[0] += 1
            return object.__getattribute__(self, name)

    real_new_chain = samples_module._new_chain

    def new_chain(call, order):  # noqa: ANN001, ANN202
        chain = real_new_chain(call, order)
        return Counted(**{f: getattr(chain, f) for f in chain.__dataclass_fields__})

    monkeypatch.setattr(samples_module, "_new_chain", new_chain)
    return reads
