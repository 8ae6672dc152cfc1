"""Finding the chain a call extends when chains branch off its prompt at many depths.

A harness decides its prompts (``/v1/completions`` takes token IDs), so its calls can leave chains
that branch off one prompt at every depth. The sorted walk took a round per such depth, each with
bisections as long as that depth: O(chains^2) per call, and a rollout of 2,000 calls of at most 1,000
tokens held the trainer's event loop for 35 s (cubic in the calls). The chains are now found by one
walk down a trie of their tokens (``samples._Chains``), linear in the prompt.
"""

from __future__ import annotations

from tests.trajectory.test_chains import (
    Calls,
    count_calls,
    reference_build,
    rollout,
)

from harnessrl.token_ids import common_prefix
from harnessrl.trajectory import build_rollout_samples


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
