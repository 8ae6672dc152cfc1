"""Turn one rollout's recorded calls into training samples (chains of calls).

A **chain** is a run of calls in which every call's prompt extends the previous call's prompt +
sampled response *exactly, token for token*. Each chain becomes one ``Sample``: one token sequence
in which the sampled responses carry loss mask 1 and everything else (the first prompt, tool output
and template glue between responses) carries loss mask 0.

Matching rule: each call (in ``seq`` order, final attempt only) joins the **longest** chain
whose tokens are a prefix of its prompt; ties go to the chain extended most recently. So a
subagent's calls interleaved with the main agent's form their own chain, and the main agent's next
call continues the main chain. A call that extends no chain starts a new one, and the reason the
chain broke is classified (see ``BREAK_REASONS`` and ``docs/trajectories.md``).

Length limit: a sample is exactly as long as its last call (prompt + response), because each call's
prompt already holds the whole chain before it. So a chain can only be "split" by ending it at the
last call that fits: a call longer than ``max_sample_tokens`` is dropped (never cut mid-response,
never re-prompted with a shortened context, which would be off-policy) and counted in
``RolloutSamples.oversized_calls``; the chain it extended ends there (break reason ``length``, once
per chain). A later call that fits and extends that chain still continues it.

What the evaluator saw: a rollout's finisher (its controller) may say in ``metadata.calls_seen``
how many calls of the final attempt its evaluator and audit read. Calls past those (by ``seq``,
which is commit order) were recorded after that read: no evaluator judged them and no audit
looked at them (their harness had usually died with them in flight), so they are left out and
counted in ``RolloutSamples.calls_unseen``. The store already refuses any call after the rollout
ended (``store.base.RolloutEnded``), so this closes the window between the read and the finish.
A rollout flagged ``tamper_finished`` was finished by someone else (its reward voided to 0): its
``calls_seen`` is theirs, not believed, and every call of its final attempt is used.

Departures from Agent Lightning v1.0 (which merges on exact prefix as well): we match against *all*
chains, not only the previous call's, and we classify every break. Identical prompts retried
by the harness are kept as separate chains (reason ``retried``): both responses were sampled
on-policy from the same context, and the discarded one is usually the policy's fault (a malformed
tool call), so it should receive the rollout's advantage too.

Pure Python: the gateway and dashboard import this module, so it never imports torch.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from harnessrl.errors import ConfigError, InvalidBatch
from harnessrl.schemas import Call, Rollout
from harnessrl.token_ids import common_prefix

#: Why a call did not extend any chain (a new sample starts). See docs/trajectories.md.
#: - ``new_context``: the prompt diverges from every chain inside that chain's first prompt, before any
#:   sampled token (a subagent, a fresh conversation sharing at most a system prompt).
#: - ``history_edited``: the prompt keeps at least one sampled response of a chain, then diverges in
#:   context after it (tool output, user turn or template glue changed), or a whole earlier response
#:   was removed/replaced (summarization, compaction, a harness rewriting history).
#: - ``prefix_mismatch``: the prompt diverges inside a sampled response or at the first token after
#:   one, or re-renders a response differently (retokenization drift, a template dropping ``<think>``,
#:   a tool-call parser normalizing JSON or whitespace).
#: - ``retried``: the prompt is a strict prefix of a chain (the harness re-sent an earlier request
#:   unchanged, or rewound the conversation to an earlier point).
#: - ``length``: a call extending a chain is longer than ``max_sample_tokens`` and was dropped; the
#:   chain's sample ends at its previous call (counted once per chain).
BREAK_REASONS: tuple[str, ...] = ("new_context", "history_edited", "prefix_mismatch", "retried", "length")

#: The rollout metadata key in which a finisher says how many calls of the final attempt its
#: evaluator and audit read (see the module docstring). Absent: every recorded call was seen.
CALLS_SEEN_KEY = "calls_seen"

#: The flag of a rollout finished behind its controller's back (``controller.TAMPER_FINISHED``, not
#: imported: the controller imports this module): its ``calls_seen`` is not believed.
TAMPER_FINISHED_FLAG = "tamper_finished"

# How many trailing tokens of a response must reappear, when a prompt diverges exactly at the start
# of that response, for the response to count as re-rendered (prefix_mismatch) not replaced.
_RERENDER_TAIL = 8
# How much longer than the original a re-rendered response may be (template glue added).
_RERENDER_SLACK = 16
# Rounds of the sorted walk in ``_Chains.longest_extended_by`` before the chains are looked up by
# length and hash instead (``_PrefixIndex``); an agent and its subagents need one or two.
_WALK_ROUNDS = 8
_HASH_MODULUS = (1 << 61) - 1  # a prime: a polynomial hash of token IDs modulo it


@dataclass(frozen=True, slots=True)
class SampledSpan:
    """A run of policy-sampled tokens in a sample: ``input_ids[start:end]``, one call's response."""

    start: int
    end: int
    policy_version: int
    call_seq: int


@dataclass(slots=True)
class Sample:
    """One token sequence for training, built from a chain of calls.

    All per-token lists have the length of ``input_ids``. ``behaviour_logprobs`` holds the engine's
    logprob of each sampled token and 0.0 on context tokens (``loss_mask`` 0). ``advantage`` is set
    by ``harnessrl.algorithms.assign_advantages``; every sample of a rollout gets the same one.
    """

    rollout_id: str
    input_ids: list[int]
    loss_mask: list[int]
    behaviour_logprobs: list[float]
    spans: list[SampledSpan]
    reward: float | None = None
    group_id: str | None = None
    task_id: str | None = None
    step: int | None = None
    sample_index: int = 0  # position of this sample among its rollout's samples
    advantage: float | None = None

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)

    def policy_versions(self) -> list[int]:
        """Per-token policy version: the version that sampled the token, -1 on context tokens."""
        versions = [-1] * len(self.input_ids)
        for span in self.spans:
            versions[span.start : span.end] = [span.policy_version] * (span.end - span.start)
        return versions


@dataclass(slots=True)
class RolloutSamples:
    """What ``build_rollout_samples`` made of one rollout, with the reasons chains broke."""

    rollout_id: str
    samples: list[Sample]
    breaks: Counter[str] = field(default_factory=Counter)
    calls_used: int = 0
    calls_other_attempts: int = 0  # calls of earlier (infra-failed) attempts, ignored
    calls_unseen: int = 0  # calls recorded after the evaluator read the rollout's calls, left out
    oversized_calls: int = 0  # calls longer than max_sample_tokens on their own, dropped
    oversized_tokens: int = 0
    empty_samples: int = 0  # chains with no sampled token (all responses empty), dropped


@dataclass(slots=True)
class _Chain:
    input_ids: list[int]
    loss_mask: list[int]
    behaviour_logprobs: list[float]
    spans: list[SampledSpan]
    last_touched: int  # order of the call that last extended it; breaks ties between equal chains
    responses: list[list[int]]  # response ids per span (for the re-render check)
    length_capped: bool = False  # a call extending it was dropped for length

    @property
    def first_response_start(self) -> int:
        """Where its first sampled token is (its end while it has none: an empty first answer
        samples nothing, so a prompt that diverges after it still keeps no sampled token)."""
        return self.spans[0].start if self.spans else len(self.input_ids)


def group_key(rollout: Rollout) -> str:
    """The group a rollout's advantage is computed in: ``group_id``, else task and step, else itself."""
    if rollout.group_id is not None:
        return rollout.group_id
    if rollout.task_id is not None:
        return f"{rollout.task_id}@{rollout.step}"
    return rollout.rollout_id


def _validate(call: Call) -> None:
    if not call.prompt_token_ids and call.response_token_ids:
        # Its sample would start with a trained token that nothing predicts: the losses take
        # position 0 for a prompt token, a packed row would score it from the sample before it,
        # and shared-prefix rows leave it out while the normalizer counts it. The gateway and
        # engines refuse an empty prompt; a library caller's call may still have one. (A teacher's
        # call records no tokens at all, neither prompt nor response: it samples nothing.)
        raise InvalidBatch(
            f"call {call.seq} of rollout {call.rollout_id} has an empty prompt: its first sampled token "
            "has no context to be predicted from"
        )
    if len(call.response_logprobs) != len(call.response_token_ids):
        raise InvalidBatch(
            f"call {call.seq} of rollout {call.rollout_id}: {len(call.response_token_ids)} response tokens "
            f"but {len(call.response_logprobs)} logprobs"
        )
    # A sampled token's logprob is a finite number <= 0. A NaN one made the importance weight of the
    # trainer proximal NaN and with it every weight of the policy; with the behaviour proximal, the
    # step's loss NaN and the token silently untrained. (The sum is one pass in C; the token is
    # looked for only when it is not finite.)
    if not math.isfinite(sum(call.response_logprobs)):
        bad = next((i for i, x in enumerate(call.response_logprobs) if not math.isfinite(x)), None)
        if bad is not None:
            raise InvalidBatch(
                f"call {call.seq} of rollout {call.rollout_id}: response token {bad} has logprob "
                f"{call.response_logprobs[bad]!r}: logprobs must be finite numbers"
            )


def _contains(haystack: Sequence[int], needle: Sequence[int]) -> bool:
    k = len(needle)
    return any(list(haystack[i : i + k]) == list(needle) for i in range(len(haystack) - k + 1))


def _classify_break(prompt: Sequence[int], closest: _Chain, p: int) -> str:
    """Why ``prompt`` extends no chain, given the chain sharing the longest prefix with it
    (``closest``, ``p`` tokens). One of ``BREAK_REASONS``."""
    if p == len(prompt):
        return "retried"
    if p < closest.first_response_start:
        return "new_context"
    for span, response in zip(closest.spans, closest.responses, strict=True):
        if span.start < p <= span.end:
            return "prefix_mismatch"
        if p == span.start:
            tail = response[-_RERENDER_TAIL:]
            window = prompt[p : p + len(response) + _RERENDER_SLACK]
            return "prefix_mismatch" if _contains(window, tail) else "history_edited"
    return "history_edited"


def _tokens(chain: _Chain) -> list[int]:
    return chain.input_ids


class _Chains:
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
        self._index: _PrefixIndex | None = None  # made on the first walk of many rounds

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
                    self._index = _PrefixIndex(self.started)
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


class _PrefixIndex:
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


def _new_chain(call: Call, order: int) -> _Chain:
    prompt = call.prompt_token_ids
    chain = _Chain(
        input_ids=list(prompt),
        loss_mask=[0] * len(prompt),
        behaviour_logprobs=[0.0] * len(prompt),
        spans=[],
        last_touched=order,
        responses=[],
    )
    _append_response(chain, call, order)
    return chain


def _append_response(chain: _Chain, call: Call, order: int) -> None:
    response = call.response_token_ids
    if response:
        start = len(chain.input_ids)
        chain.spans.append(SampledSpan(start, start + len(response), call.policy_version, call.seq))
        chain.responses.append(list(response))
    chain.input_ids.extend(response)
    chain.loss_mask.extend([1] * len(response))
    chain.behaviour_logprobs.extend(call.response_logprobs)
    chain.last_touched = order


def build_rollout_samples(
    rollout: Rollout, calls: Sequence[Call], *, max_sample_tokens: int | None = None
) -> RolloutSamples:
    """Build the samples of one rollout from its calls, reporting why chains broke.

    Only calls of the rollout's final attempt (``rollout.attempt``) are used; they are taken in
    ``seq`` order. Samples come out in the order their chains started.
    """
    builder = SampleBuilder(rollout, max_sample_tokens=max_sample_tokens)
    final = sorted((c for c in calls if c.attempt == rollout.attempt), key=lambda c: c.seq)
    other_attempts, unseen = len(calls) - len(final), 0
    seen = calls_seen(rollout)
    if seen is not None and len(final) > seen:
        unseen = len(final) - seen
        final = final[:seen]
    for call in final:
        builder.add(call)
    result = builder.finish()
    result.calls_other_attempts, result.calls_unseen = other_attempts, unseen
    return result


class SampleBuilder:
    """``build_rollout_samples`` one call at a time, for a reader that must not hold every call of a
    long rollout at once (the dashboard's trace decodes them one by one). Give ``add`` the calls
    ``build_rollout_samples`` uses, in its order: the final attempt's, by ``seq``, the first
    ``calls_seen`` of them; then ``finish`` once."""

    def __init__(self, rollout: Rollout, *, max_sample_tokens: int | None = None) -> None:
        if max_sample_tokens is not None and max_sample_tokens < 1:
            raise ConfigError("max_sample_tokens must be at least 1")
        self.rollout, self.max_sample_tokens = rollout, max_sample_tokens
        self.result = RolloutSamples(rollout_id=rollout.rollout_id, samples=[])
        self._chains = _Chains()
        self._order = 0
        self.tokens = 0  # tokens the chains hold (a reader that must stay bounded stops on it)

    def add(self, call: Call) -> str | None:
        """Take the next call; the reason it broke a chain (one of ``BREAK_REASONS``), if it did.
        ``InvalidBatch`` for a call the trainer refuses."""
        order, chains, result = self._order, self._chains, self.result
        self._order += 1
        _validate(call)
        prompt = call.prompt_token_ids
        chain = chains.longest_extended_by(prompt)
        size = len(prompt) + len(call.response_token_ids)
        if self.max_sample_tokens is not None and size > self.max_sample_tokens:
            # Keeping this call means keeping its whole prompt as context: no shorter on-policy
            # sample exists. Drop it; the chain it extended ends at its previous call.
            result.oversized_calls += 1
            result.oversized_tokens += size
            if chain is not None and not chain.length_capped:
                chain.length_capped = True
                result.breaks["length"] += 1
                return "length"
            return None
        reason = None
        if chain is not None:
            self.tokens += size - len(chain.input_ids)
            # tool output, template glue: mask 0
            chains.extend(chain, prompt[len(chain.input_ids) :], call, order)
        else:
            if chains:
                reason = _classify_break(prompt, *chains.closest(prompt))
                result.breaks[reason] += 1
            self.tokens += size
            chains.add(_new_chain(call, order))
        result.calls_used += 1
        return reason

    def finish(self) -> RolloutSamples:
        """The samples of the calls added, in the order their chains started."""
        rollout, result = self.rollout, self.result
        for chain in self._chains.started:
            if not chain.spans:
                result.empty_samples += 1
                continue
            result.samples.append(
                Sample(
                    rollout_id=rollout.rollout_id,
                    input_ids=chain.input_ids,
                    loss_mask=chain.loss_mask,
                    behaviour_logprobs=chain.behaviour_logprobs,
                    spans=chain.spans,
                    reward=rollout.reward,
                    group_id=group_key(rollout),
                    task_id=rollout.task_id,
                    step=rollout.step,
                    sample_index=len(result.samples),
                )
            )
        return result


def calls_seen(rollout: Rollout) -> int | None:
    """How many calls of the final attempt the rollout's evaluator read (``metadata.calls_seen``),
    or ``None`` if its finisher did not say (anything but a non-negative integer counts as unsaid).

    ``None`` too for a rollout flagged ``tamper_finished``: someone other than its controller
    finished it (the agent, with a stolen admin key), so the finish's metadata is the agent's word,
    and ``calls_seen = 0`` there would keep every call of the voided rollout out of training."""
    if TAMPER_FINISHED_FLAG in rollout.flags:
        return None
    seen = rollout.metadata.get(CALLS_SEEN_KEY)
    if isinstance(seen, int) and not isinstance(seen, bool) and seen >= 0:
        return seen
    return None


def calls_to_samples(
    rollout: Rollout, calls: Sequence[Call], *, max_sample_tokens: int | None = None
) -> list[Sample]:
    """The samples of one rollout (see ``build_rollout_samples`` for the break report)."""
    return build_rollout_samples(rollout, calls, max_sample_tokens=max_sample_tokens).samples
