"""The trie that finds chains gives exactly what the sorted chains before it gave, and the cost of
a run of chains sharing one prefix.

``_Chains`` was a sorted list of the chains (bisected) plus a hash index past a few rounds of its
walk. Classifying a break took the latest touched of *every* chain sharing the prompt's longest
shared prefix (a scan per call) and compared that prefix once per bisection step: 2,000 calls
sharing one 2k-token system prompt and task, each starting a chain (parallel subagents, retries),
took 3.5 s of CPU (8k tokens: 14 s). ``OldChains`` below is that class as it was (verbatim but
for the names), kept as the reference: whole rollouts are built with each, thousands of random
ones (ties, retries, equal chains, attempts, ``calls_seen``, ``max_sample_tokens``), and must come
out identical, break reason by break reason.
"""

from __future__ import annotations

import bisect
import random
from collections import Counter
from collections.abc import Iterable, Sequence

import pytest
from tests.trajectory.test_chains import Calls, count_last_touched_reads, rollout

from harnessrl.errors import InvalidBatch
from harnessrl.schemas import Call, Rollout
from harnessrl.token_ids import common_prefix
from harnessrl.trajectory import SampleBuilder, build_rollout_samples
from harnessrl.trajectory import samples as samples_module
from harnessrl.trajectory.samples import _append_response, _Chain

# -- the reference: ``samples._Chains`` before the trie, verbatim ---------------------------------
_WALK_ROUNDS = 8
_HASH_MODULUS = (1 << 61) - 1


def _tokens(chain: _Chain) -> list[int]:
    return chain.input_ids


class OldChains:
    """A rollout's chains so far: in the order they started (the samples' order), and sorted by
    their tokens.

    Why sorted: a call that extends no chain is classified against the chain sharing the longest
    prefix with its prompt. Comparing the prompt with every chain cost O(chains x tokens) per break,
    O(calls^2 x tokens) per rollout when every call breaks (400 calls of 8 k tokens sharing a prefix:
    28 s on the trainer's event loop), and the harness decides how many calls there are. In token
    order, the chains sharing the most with a prompt sit around its insertion point, so bisection
    finds them with O(log chains) comparisons of at most the prompt's length.

    Finding the chain a call extends walks down the sorted chains, a round per depth at which chains
    branch off its prompt: one or two for an agent and its subagents, but a harness can branch them
    at every depth, so past ``_WALK_ROUNDS`` rounds the chains are looked up by length and hash
    instead (``_PrefixIndex``, made then and kept up to date from then on).

    A chain's tokens change only through ``extend``, which takes it out of the order and puts it
    back, so the order always holds. Each chain (re)enters after every chain of equal tokens: those
    were touched earlier, so a run of equal chains is ordered by ``last_touched``.
    """

    def __init__(self) -> None:
        self.started: list[_Chain] = []
        self._ordered: list[_Chain] = []
        self._latest: _Chain | None = None  # the chain touched last (the highest ``last_touched``)
        self._index: _OldPrefixIndex | None = None  # made on the first walk of many rounds

    def __bool__(self) -> bool:
        return bool(self.started)

    def add(self, chain: _Chain) -> None:
        self.started.append(chain)
        bisect.insort_right(self._ordered, chain, key=_tokens)
        self._latest = chain
        if self._index is not None:
            self._index.add(chain)

    def extend(self, chain: _Chain, context: Sequence[int], call: Call, order: int) -> None:
        """Append ``context`` (mask 0) and ``call``'s response to ``chain``."""
        if self._index is not None:
            self._index.remove(chain)
        alone = len(self._ordered) == 1  # most rollouts: one chain, always in order
        if not alone:
            i = bisect.bisect_left(self._ordered, chain.input_ids, key=_tokens)
            while self._ordered[i] is not chain:  # past the earlier chains of equal tokens
                i += 1
            del self._ordered[i]
        chain.input_ids.extend(context)
        chain.loss_mask.extend([0] * len(context))
        chain.behaviour_logprobs.extend([0.0] * len(context))
        _append_response(chain, call, order)
        self._latest = chain
        if not alone:
            bisect.insort_right(self._ordered, chain, key=_tokens)
        if self._index is not None:
            self._index.add(chain)

    def longest_extended_by(self, prompt: list[int]) -> _Chain | None:
        """The longest chain whose tokens are a prefix of ``prompt`` (ties: the latest touched)."""
        ordered, target = self._ordered, prompt
        rounds = 0
        while True:
            if rounds > _WALK_ROUNDS:
                # Chains branch off this prompt at many depths: each round costs bisections as long
                # as its depth, and a harness can make the rounds as many as its calls (2,000 calls of
                # at most 1,000 tokens, each branching one token deeper: 35 s). Look up by hash.
                if self._index is None:
                    self._index = _OldPrefixIndex(self.started)
                return self._index.longest_prefix_of(prompt)
            rounds += 1
            # The last chain sorting at or before ``target`` is the latest touched of its equals.
            # Every chain that is a prefix of ``target`` sorts before it, and then also before that
            # chain and is a prefix of it: so that chain is the answer if it is a prefix of
            # ``target``, and otherwise the answer is a prefix of what they share (each round
            # shortens ``target``; one or two rounds unless the chains branch at many depths).
            i = bisect.bisect_right(ordered, target, key=_tokens)
            if i == 0:
                return None
            candidate = ordered[i - 1]
            tokens = candidate.input_ids
            if len(tokens) <= len(target) and target[: len(tokens)] == tokens:
                return candidate  # the common case, one comparison in C (common_prefix bisects)
            target = target[: common_prefix(target, tokens)]

    def closest(self, prompt: list[int]) -> tuple[_Chain, int]:
        """The chain sharing the longest prefix with ``prompt`` (ties: the latest touched) and how
        many tokens they share. There must be at least one chain."""
        ordered = self._ordered
        # The longest prefix shared with a sorted list's members is shared with one of the two
        # around the prompt's insertion point: a member further away agrees with the prompt on no
        # more tokens than the neighbour between them does.
        i = bisect.bisect_left(ordered, prompt, key=_tokens)
        p = max(common_prefix(prompt, ordered[j].input_ids) for j in (i - 1, i) if 0 <= j < len(ordered))
        if p == 0 and self._latest is not None:
            # Every chain shares nothing: the run below would be all of them, scanned per call, which
            # made a rollout of calls whose prompts share no first token O(calls^2) (20k calls: 11 s).
            return self._latest, 0
        # Every chain that starts with prompt[:p] shares exactly p tokens: a contiguous run, whose
        # latest touched is found by comparing integers (``last_touched``), not tokens.
        shared = prompt[:p]
        lo = bisect.bisect_left(ordered, shared, key=_tokens)
        hi = bisect.bisect_right(ordered, shared, lo=lo, key=lambda c: c.input_ids[:p])
        return max(ordered[lo:hi], key=lambda c: c.last_touched), p


class _OldPrefixIndex:
    """The chains by length and by a hash of their tokens: the longest chain that is a prefix of a
    prompt in one pass over the prompt (its prefix hashes) and one look-up per distinct chain length
    up to the prompt's, each hit checked token for token (a collision costs a comparison, never a
    wrong answer). Linear in the prompt whatever the chains, where the sorted walk of
    ``_Chains.longest_extended_by`` takes a round per depth at which chains branch off it. Made only
    when a walk takes many rounds (it hashes every token a chain takes from then on). The hash's
    base is drawn per rollout, so a harness cannot aim collisions at it."""

    def __init__(self, chains: Iterable[_Chain]) -> None:
        self._base = random.Random().randrange(1 << 32, _HASH_MODULUS)
        self._by_key: dict[tuple[int, int], list[_Chain]] = {}  # (length, hash) -> chains
        self._keys: dict[int, tuple[int, int]] = {}  # id(chain) -> its key
        self._lengths: list[int] = []  # the distinct chain lengths, sorted
        self._count: Counter[int] = Counter()  # chains per length
        for chain in chains:
            self.add(chain)

    def _hash(self, tokens: Sequence[int]) -> list[int]:
        """The hashes of ``tokens[:k]`` for k = 0 .. len(tokens)."""
        base, modulus, h = self._base, _HASH_MODULUS, 0
        out = [0]
        for token in tokens:
            h = (h * base + token + 1) % modulus
            out.append(h)
        return out

    def add(self, chain: _Chain) -> None:
        n = len(chain.input_ids)
        key = (n, self._hash(chain.input_ids)[-1])
        self._keys[id(chain)] = key
        self._by_key.setdefault(key, []).append(chain)
        if not self._count[n]:
            bisect.insort(self._lengths, n)
        self._count[n] += 1

    def remove(self, chain: _Chain) -> None:
        key = self._keys.pop(id(chain))
        bucket = self._by_key[key]
        del bucket[next(i for i, c in enumerate(bucket) if c is chain)]
        if not bucket:
            del self._by_key[key]
        n = key[0]
        self._count[n] -= 1
        if not self._count[n]:
            del self._lengths[bisect.bisect_left(self._lengths, n)]

    def longest_prefix_of(self, prompt: list[int]) -> _Chain | None:
        """The longest chain whose tokens are a prefix of ``prompt`` (ties: the latest touched)."""
        top = bisect.bisect_right(self._lengths, len(prompt))
        if top == 0:
            return None
        hashes = self._hash(prompt[: self._lengths[top - 1]])
        for n in reversed(self._lengths[:top]):
            bucket = self._by_key.get((n, hashes[n]))
            if bucket:
                head = prompt[:n]
                found = [c for c in bucket if c.input_ids == head]
                if found:
                    return max(found, key=lambda c: c.last_touched)
        return None


# -- random rollouts ------------------------------------------------------------------------------
def random_calls(rng: random.Random) -> list[Call]:
    """A rollout as a random program over a tiny alphabet (so chains tie, repeat and prefix each
    other): extend a history, branch off one at any depth, re-send an earlier prompt (sometimes
    answered the same), start fresh with or without a shared system prompt, branch at every depth."""
    c = Calls()
    system = [rng.randrange(4) for _ in range(rng.randrange(0, 6))]
    histories: list[list[int]] = []

    def tokens(most: int) -> list[int]:
        return [rng.randrange(4) for _ in range(rng.randrange(most + 1))]

    for _ in range(rng.randrange(1, 26)):
        action = (
            rng.choice(["extend", "extend", "branch", "retry", "fresh", "shared"]) if histories else "fresh"
        )
        response = tokens(3)
        if action == "extend":
            prompt = rng.choice(histories) + tokens(3)
        elif action == "branch":
            base = rng.choice(histories)
            prompt = base[: rng.randrange(len(base) + 1)] + tokens(3)
        elif action == "retry":
            earlier = rng.choice(c.calls)
            prompt = list(earlier.prompt_token_ids)
            if rng.random() < 0.5:
                response = list(earlier.response_token_ids)
        elif action == "shared":
            prompt = system + tokens(3)
        else:
            prompt = tokens(4)
        if not prompt and response and rng.random() < 0.9:
            prompt = [rng.randrange(4)]  # an empty prompt with an answer is refused (tested below)
        attempt = 0 if rng.random() < 0.8 else 1
        histories.append(c.add(prompt, response, version=rng.randrange(3), attempt=attempt))
    if rng.random() < 0.1:  # chains branching off one prompt at every depth (the old hash index)
        deep = [5 + i % 3 for i in range(rng.randrange(10, 30))]
        for i in range(1, len(deep)):
            c.add(deep[:i] + [9], [8])
        for _ in range(rng.randrange(1, 4)):
            c.add(deep + tokens(2), tokens(2))
    calls = c.calls
    rng.shuffle(calls)  # the builder takes them by seq
    return calls


def random_rollout(rng: random.Random, n: int) -> Rollout:
    metadata, flags = {}, []
    if rng.random() < 0.3:
        metadata["calls_seen"] = rng.randrange(n + 3)
        if rng.random() < 0.2:
            flags = ["tamper_finished"]
    return Rollout(
        rollout_id="r",
        api_key="k",
        task_id="t",
        step=0,
        attempt=rng.choice([0, 0, 0, 1]),
        reward=1.0,
        metadata=metadata,
        flags=flags,
    )


def build_with(chains_class: type, r: Rollout, calls: list[Call], limit: int | None) -> object:
    """The rollout's samples and each added call's break reason, or the error it is refused with."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(samples_module, "_Chains", chains_class)
        try:
            built = build_rollout_samples(r, calls, max_sample_tokens=limit)
        except InvalidBatch as exc:
            return ("refused", str(exc))
        final = sorted((c for c in calls if c.attempt == r.attempt), key=lambda c: c.seq)
        seen = samples_module.calls_seen(r)
        final = final if seen is None else final[:seen]
        builder = SampleBuilder(r, max_sample_tokens=limit)
        reasons = [builder.add(call) for call in final]
        return built, reasons, builder.tokens


def test_the_trie_builds_every_rollout_exactly_as_the_sorted_chains_did() -> None:
    rng = random.Random(20261207)
    refused = breaks = 0
    for case in range(4000):
        calls = random_calls(rng)
        r = random_rollout(rng, len(calls))
        limit = rng.choice([None, None, rng.randrange(1, 30)])
        new = build_with(samples_module._Chains, r, calls, limit)
        old = build_with(OldChains, r, calls, limit)
        assert new == old, (case, r, limit, calls)
        refused += new[0] == "refused"
        breaks += new[0] != "refused" and sum(new[0].breaks.values()) > 0
    # The cases reach what they are for: breaks of every kind, refusals, not only one kind.
    assert breaks > 2000 and 0 < refused < 400, (breaks, refused)


def test_the_random_rollouts_reach_every_break_reason_and_counter() -> None:
    rng = random.Random(7)
    reasons: Counter[str] = Counter()
    unseen = other = oversized = empty = 0
    for _ in range(1000):
        calls = random_calls(rng)
        r = random_rollout(rng, len(calls))
        try:
            built = build_rollout_samples(
                r, calls, max_sample_tokens=rng.choice([None, rng.randrange(1, 30)])
            )
        except InvalidBatch:
            continue
        reasons += built.breaks
        unseen += built.calls_unseen
        other += built.calls_other_attempts
        oversized += built.oversized_calls
        empty += built.empty_samples
    assert set(reasons) == set(samples_module.BREAK_REASONS), reasons
    assert unseen and other and oversized and empty


def test_a_run_of_chains_sharing_one_prefix_is_classified_without_scanning_the_run(monkeypatch) -> None:
    """Every call shares one system prompt and task, then starts a chain of its own: classifying
    each break took the latest touched of every chain sharing that prefix (all of them), n^2/2
    reads of ``last_touched`` per rollout. Counted, not timed: none now."""
    reads = count_last_touched_reads(monkeypatch)
    c = Calls()
    shared = [10 + i % 50 for i in range(60)]
    n = 400
    for i in range(n):
        c.add(shared + [1000 + i, 7], [8, 9])
    built = build_rollout_samples(rollout(), c.calls)
    assert len(built.samples) == n and built.breaks == {"new_context": n - 1}
    assert reads[0] <= 4 * n, reads[0]  # before: ~n^2 / 2 (80,000 here)


def test_a_built_rollout_is_freed_as_soon_as_it_is_dropped() -> None:
    """The chains' index holds every chain's tokens: it must not be a reference cycle, which only a
    full garbage collection frees (the dashboard's trace builds rollout after rollout and keeps
    none). Garbage collection is off here: what is not freed by reference counting stays."""
    import gc
    import tracemalloc

    c = Calls()
    shared = list(range(100, 20_100))  # 20k tokens
    for i in range(20):  # chains branching at several depths, each extended twice
        history = c.add(shared[: 1000 * (i + 1)] + [5, i], [6])
        c.add(history + [7], [8])
        c.add(history + [7, 8, 9], [10])
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        built = build_rollout_samples(rollout(), c.calls)
        assert len(built.samples) == 20
        held, _ = tracemalloc.get_traced_memory()
        del built
        left, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        gc.enable()
    assert held > 1_000_000 and left < held / 20, (held, left)
