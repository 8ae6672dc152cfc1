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

import math
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


def loss_token_outside_spans(loss_mask: Sequence[int], spans: Iterable[SampledSpan]) -> int | None:
    """The first token ``loss_mask`` trains that none of a sample's ``spans`` says the policy
    sampled, or ``None``.

    A built sample's mask is 1 exactly on its spans. One read from a file or built by hand can say
    more: a tool-output or template token trained as if the policy had sampled it (its behaviour
    log-prob 0.0, probability 1). A reader checks this before training. (A mask 0 inside a span, a
    sampled token deliberately left untrained, is allowed.) One C-level sum per span; the token is
    looked for only when the sums disagree."""
    mask, merged = loss_mask, []
    for start, end in sorted((span.start, span.end) for span in spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    if sum(mask) == sum(sum(mask[start:end]) for start, end in merged):
        return None
    inside = [False] * len(mask)
    for start, end in merged:
        inside[start:end] = [True] * (end - start)
    return next((t for t, m in enumerate(mask) if m and not inside[t]), None)


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


class _Node:
    """A node of ``_Chains``' trie: the tokens ``tokens[start:end]`` on the edge into it (``end`` is its
    depth), its children by their edge's first token, the chains whose tokens end exactly here, and
    the latest touched chain of its subtree."""

    __slots__ = ("tokens", "start", "end", "children", "ends", "latest")

    def __init__(self, tokens: list[int], start: int, end: int) -> None:
        # ``tokens`` is the ``input_ids`` of a chain that passes through this node: chains only ever
        # grow at their end, so its first ``end`` tokens are this node's path for good. (No parent
        # pointer: it made every trie a reference cycle, freed with the chains' tokens only by a
        # full garbage collection.)
        self.tokens, self.start, self.end = tokens, start, end
        self.children: dict[int, _Node] = {}
        # By id; in the order they arrived, which is the order they were touched (a chain arrives
        # when it is touched, and each touch is the latest so far): the last is the latest.
        self.ends: dict[int, _Chain] = {}
        self.latest: _Chain | None = None


class _Chains:
    """A rollout's chains so far: in the order they started (the samples' order), and in a trie of
    their tokens (a radix tree: one node per point where chains branch or end).

    Why a trie: a call is matched (the longest chain that is a prefix of its prompt) and a break is
    classified (the chain sharing the longest prefix with its prompt, ties to the latest touched)
    by one walk down the trie along the prompt, linear in the prompt whatever the other chains are.
    Comparing prompts with chains instead (sorted chains, bisected) cost a comparison of the shared
    prefix per bisection step and a scan of every chain sharing it: 2,000 calls sharing one 2k-token
    system prompt and task, each starting a chain of its own (parallel subagents, retries), took
    3.5 s of CPU on the trainer's event loop (8k tokens: 14 s; now 0.4 s and 1.4 s), and the harness
    decides how many calls there are.

    Each node keeps the latest touched chain of its subtree. A touched chain is the latest of all,
    and it is set on every node of its path: those nodes are the ones the call's prompt was just
    walked down, so keeping them costs no more than the walk. A chain only grows at its end, so it
    only ever moves deeper along its own path and never leaves a subtree it was in.
    """

    def __init__(self) -> None:
        self.started: list[_Chain] = []
        self._root = _Node([], 0, 0)
        self._node_of: dict[int, _Node] = {}  # id(chain) -> the node its tokens end at

    def __bool__(self) -> bool:
        return bool(self.started)

    def add(self, chain: _Chain) -> None:
        self.started.append(chain)
        self._insert(chain, self._root)

    def extend(self, chain: _Chain, context: Sequence[int], call: Call, order: int) -> None:
        """Append ``context`` (mask 0) and ``call``'s response to ``chain``."""
        chain.input_ids.extend(context)
        chain.loss_mask.extend([0] * len(context))
        chain.behaviour_logprobs.extend([0.0] * len(context))
        _append_response(chain, call, order)
        node = self._node_of[id(chain)]
        if len(node.ends) == 1 and not node.children and node is not self._root:
            # Alone at a leaf (most rollouts' main chain): its edge just grows.
            node.tokens, node.end = chain.input_ids, len(chain.input_ids)
            self._mark_latest(node, chain)
            return
        del node.ends[id(chain)]
        self._insert(chain, node)
        self._merge_if_pass_through(node)

    def longest_extended_by(self, prompt: list[int]) -> _Chain | None:
        """The longest chain whose tokens are a prefix of ``prompt`` (ties: the latest touched)."""
        ending = self._walk(prompt, self._root)[3]
        return next(reversed(ending.ends.values())) if ending is not None else None

    def closest(self, prompt: list[int]) -> tuple[_Chain, int]:
        """The chain sharing the longest prefix with ``prompt`` (ties: the latest touched) and how
        many tokens they share. There must be at least one chain."""
        node, partial, shared, _ = self._walk(prompt, self._root)
        # Every chain below the point where the prompt leaves the trie shares exactly ``shared``
        # tokens with it, and no other chain shares as many.
        latest = (partial or node).latest
        assert latest is not None, "closest() needs at least one chain"
        return latest, shared

    def _walk(self, tokens: list[int], node: _Node) -> tuple[_Node, _Node | None, int, _Node | None]:
        """Follow ``tokens`` down from ``node`` (a node on their path): the deepest node whose whole
        path they start with, the child they go on into part way (or ``None``), how many tokens
        they share with the trie, and the deepest node on the way at which a chain ends."""
        depth, n = node.end, len(tokens)
        ending = node if node.ends else None
        while depth < n:
            child = node.children.get(tokens[depth])
            if child is None:
                break
            end = child.end
            if end <= n and child.tokens[depth:end] == tokens[depth:end]:  # one compare in C
                node, depth = child, end
                if child.ends:
                    ending = child
                continue
            # They part inside the child's edge (its first token is shared: it is the child's key).
            top = min(end, n)
            return node, child, depth + common_prefix(child.tokens[depth:top], tokens[depth:top]), ending
        return node, None, depth, ending

    def _insert(self, chain: _Chain, node: _Node) -> None:
        """Put ``chain`` in the trie, walking down from ``node`` (a node on its path)."""
        tokens = chain.input_ids
        node, partial, depth, _ = self._walk(tokens, node)
        if partial is not None:  # split the child's edge where the chain leaves it
            middle = _Node(partial.tokens, partial.start, depth)
            middle.latest = partial.latest
            node.children[partial.tokens[partial.start]] = middle
            middle.children[partial.tokens[depth]] = partial
            partial.start = depth
            node = middle
        if depth < len(tokens):
            leaf = _Node(tokens, depth, len(tokens))
            node.children[tokens[depth]] = leaf
            node = leaf
        node.ends[id(chain)] = chain
        self._node_of[id(chain)] = node
        self._mark_latest(node, chain)

    def _merge_if_pass_through(self, node: _Node) -> None:
        """Fold ``node`` into its only child when no chain ends there any more: a pair of equal
        chains extended in step would otherwise leave a node per call on their path."""
        if node.ends or len(node.children) != 1 or node is self._root:
            return
        parent = self._path_to(node)[-2]
        (child,) = node.children.values()
        child.start = node.start
        parent.children[child.tokens[child.start]] = child

    def _mark_latest(self, node: _Node, chain: _Chain) -> None:
        for on_path in self._path_to(node):
            on_path.latest = chain

    def _path_to(self, node: _Node) -> list[_Node]:
        """The nodes from the root down to ``node``, followed by its own tokens: one look-up a node."""
        here, tokens = self._root, node.tokens
        path = [here]
        while here is not node:
            here = here.children[tokens[here.end]]
            path.append(here)
        return path


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
