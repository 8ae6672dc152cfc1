"""How many samples a rollout's calls make, counted from the store's chain bases without reading a
token: what the rollouts table shows for each of its 50 rows.

Why not build the samples. ``trajectory.build_rollout_samples`` compares every prompt with every
chain, token for token, after decoding every call in full (prompts and requests): for 50 rollouts
of 100 calls growing to ~32k tokens that is seconds per page, for one number per row. The store
already did that comparison once, when each call was written (``store.chains``): ``prompt_base_seq``
names an earlier call of the same attempt whose prompt + response is a prefix of this call's prompt,
the longest such call among the chains it remembers.

The count. A sample's tokens are those of its newest call (prompt + response), so a call whose base
is the newest call of a chain extends that chain; a call with no base, or whose base some later call
already extended (a retried request, a history rewound or edited), starts a chain. Then, as
``build_rollout_samples`` does: only the final attempt's calls, only the first ``calls_seen`` of
them (``metadata.calls_seen``), no call longer than the run's ``trainer.max_sample_tokens``
(prompt + response: the trainer drops it), and a chain whose calls sampled no token is no sample.

Where it can differ from the samples a trace (or the trainer) builds: the writer remembers at most
``store.chains.MAX_CHAINS`` chains per attempt, so a call extending a chain forgotten behind eight
newer ones has no base and counts as a new sample; and a call whose longest base is a mid-chain call
while a shorter chain's newest call is also a prefix of it (two chains that sampled identical
tokens) counts as one more. Neither happens to an agent and its few subagents; the trace page's
count is always exact.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from harnessrl.schemas import Rollout
from harnessrl.trajectory import calls_seen


@dataclass(frozen=True, slots=True)
class CallLink:
    """What the count reads of one stored call: no tokens, no request."""

    seq: int
    attempt: int
    base_seq: int | None  # ``prompt_base_seq``: the call whose prompt + response this prompt extends
    sampled: int  # response tokens
    prompt_len: int = 0  # prompt tokens (``prompt_len``): with ``sampled``, the call's sample length


def count_samples(
    rollout: Rollout, calls: Iterable[CallLink], *, max_sample_tokens: int | None = None
) -> int:
    """The samples ``rollout``'s calls make (see the module docstring for where this can differ).
    ``max_sample_tokens``: the run's ``trainer.max_sample_tokens``; a longer call is dropped."""
    final = sorted((c for c in calls if c.attempt == rollout.attempt), key=lambda c: c.seq)
    seen = calls_seen(rollout)
    if seen is not None:
        final = final[:seen]
    chain_of_newest: dict[int, int] = {}  # the newest call of each chain -> that chain
    sampled_by_chain: list[bool] = []  # whether the chain has a sampled token (else it is no sample)
    for call in final:
        if max_sample_tokens is not None and call.prompt_len + call.sampled > max_sample_tokens:
            continue  # dropped; a call extending it is longer still, so dropped too
        chain = chain_of_newest.pop(call.base_seq, None) if call.base_seq is not None else None
        if chain is None:
            chain = len(sampled_by_chain)
            sampled_by_chain.append(False)
        chain_of_newest[call.seq] = chain
        sampled_by_chain[chain] = sampled_by_chain[chain] or call.sampled > 0
    return sum(sampled_by_chain)
