"""Finding the chain a call extends when chains branch off its prompt at many depths.

A harness decides its prompts (``/v1/completions`` takes token IDs), so its calls can leave chains
that branch off one prompt at every depth. The sorted walk took a round per such depth, each with
bisections as long as that depth: O(chains^2) per call, and a rollout of 2,000 calls of at most 1,000
tokens held the trainer's event loop for 35 s (cubic in the calls). Past a few rounds the chains are
now looked up by length and hash (``samples._PrefixIndex``), linear in the prompt.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.trajectory.test_chains import (
    Calls,
    branching_call_sequences,
    call_sequences,
    count_calls,
    reference_build,
    rollout,
)

from harnessrl.token_ids import common_prefix
from harnessrl.trajectory import build_rollout_samples
from harnessrl.trajectory import samples as samples_module


def branching_at_every_depth(depth: int, calls: int) -> Calls:
    """``depth`` chains branching off one long prompt ``P``, one token deeper each, then ``calls``
    calls whose prompts are ``P`` and one new token (each breaks and starts a chain of its own)."""
    c = Calls()
    prompt = [100 + i % 50 for i in range(depth + 1)]
    for i in range(1, depth + 1):
        c.add(prompt[:i] + [1], [2])  # 1 sorts before every token of P: each branch is a new depth
    for j in range(calls):
        c.add(prompt + [3 + j], [4])
    return c


def test_a_call_is_matched_in_a_few_rounds_however_deep_chains_branch_off_it() -> None:
    c = branching_at_every_depth(300, 300)
    built = None

    def build() -> None:
        nonlocal built
        built = build_rollout_samples(rollout(), c.calls)

    compared = count_calls(common_prefix, build)
    assert built is not None
    chains, breaks = reference_build(c.calls, None)
    assert [[sp.call_seq for sp in s.spans] for s in built.samples] == chains
    assert built.breaks == breaks
    # A few rounds of the walk (each one comparison) and the break's classification per call; it
    # was one round per depth: about 300 per call here.
    assert compared <= 16 * len(c.calls), compared


def test_the_control_an_agent_and_its_subagent_never_need_the_index(monkeypatch) -> None:
    """The walk alone answers an ordinary rollout: the index is never made."""
    made = []
    real = samples_module._PrefixIndex
    monkeypatch.setattr(samples_module, "_PrefixIndex", lambda chains: made.append(1) or real(chains))
    c = Calls()
    main = c.add([1, 2, 3], [4, 5])
    sub = c.add([1, 2, 9], [6])
    for k in range(20):
        main = c.add(main + [7, k], [8])
        sub = c.add(sub + [7, k], [8])
    built = build_rollout_samples(rollout(), c.calls)
    assert len(built.samples) == 2 and not made
    monkeypatch.setattr(samples_module, "_PrefixIndex", lambda chains: made.append(1) or real(chains))
    build_rollout_samples(rollout(), branching_at_every_depth(40, 3).calls)
    assert made == [1]  # the probe notices the index when it is made


@settings(max_examples=400, deadline=None)
@given(st.one_of(call_sequences(), branching_call_sequences()), st.one_of(st.none(), st.integers(2, 20)))
def test_the_index_finds_what_the_plain_definition_does(calls, limit) -> None:
    """With the walk given no round at all, every call is matched by the index alone."""
    saved = samples_module._WALK_ROUNDS
    samples_module._WALK_ROUNDS = -1
    try:
        built = build_rollout_samples(rollout(), calls, max_sample_tokens=limit)
    finally:
        samples_module._WALK_ROUNDS = saved
    chains, breaks = reference_build(calls, limit)
    assert [[sp.call_seq for sp in s.spans] for s in built.samples] == chains
    assert built.breaks == breaks
