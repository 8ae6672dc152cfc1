"""Calls stored as deltas on their chain: which earlier call a new ``calls`` row extends (issue 22).

Why. Call n of an agent usually repeats call n-1's whole prompt, its sampled answer and the whole
request history, then adds a little. Stored whole, a rollout of n calls over a growing context
costs O(n x context); stored as deltas it costs about its final call. A row holds only what is new
relative to earlier calls of the same rollout *attempt* (a retry never refers into an abandoned
attempt):

=====================  ==========================================================================
``prompt_token_ids``   the prompt's token IDs after those of call ``prompt_base_seq`` (its prompt
                       then its response); the whole prompt when that is NULL
``prompt_base_seq``    a call whose prompt + response token IDs are a prefix of this prompt, or NULL
``prompt_len``         the whole prompt's length in tokens (context size without decoding; checked
                       on every read)
``request``            the request's *frame*: its JSON with the history list (``request_key``) set to
                       null: model, tools, system prompt...; the JSON text ``null`` when it equals
                       call ``request_base_seq``'s frame; the whole request when ``request_key`` is NULL
``request_key``        a ``HISTORY_KEYS`` key: the one whose list is in ``request_items``; NULL when
                       the request has no such list (``completions``, a string ``input``)
``request_items``      the JSON texts of the list's items after the base's, one per line (compact
                       JSON never holds a raw newline); all of them when ``request_base_seq`` is NULL
``request_base_seq``   a call whose history list starts this one, item for item as JSON text
``request_base_items`` how many of that call's items start this one; NULL: all of them (schema 5)
=====================  ==========================================================================

Nothing is guessed: a base is taken only where its bytes (or item texts) are an exact prefix, as
compared on write, so an edited history (a message changed or removed, a compacted context) gets
the longest base before the edit, or none: a full copy. A request may take only the leading items
of a longer call (``request_base_items``): Claude Code moves its ``cache_control`` marker to the
newest message on every call, so each request repeats the previous one but for the last message;
without a partial base no earlier call was ever a prefix and every request was stored whole
(O(calls x context) again). Token chains need no such thing: a prompt continues the sampled
tokens. Reading is ``codecs.calls_from_rows``: one pass over a rollout's rows, each made whole
from rows already read, so its cost is what it returns.

Choosing a base. The writer keeps, per rollout attempt, a few chains (``AttemptChains``): the
packed tokens (or item texts) of the newest call on each, and the length and seq of each call
along it; every call on a chain is a prefix of its newest, so any of them can be a base. A
subagent's calls interleaved with the main agent's form their own chain; a retried request (the
same prompt again) takes the retried call's own base. The store keeps these per rollout in memory
(``ChainCache``) and checks them against the rollout's newest seq before each write: a gap (a peer
gateway wrote, a restart, an eviction) rebuilds them from the attempt's rows, so a stale memory can
cost bytes, never correctness. The encoding is written once per call; migration 4 converts older
rows with this same ``place``.
"""

from __future__ import annotations

import bisect
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from harnessrl.schemas import Call
from harnessrl.store.codecs import (
    SAME_FRAME,
    Row,
    check_ints,
    check_keys,
    dump_call_json,
    pack_floats,
    pack_ints,
    unfold_rows,
)

#: Chains remembered per rollout attempt (a main agent and a few subagents at once).
MAX_CHAINS = 8
#: Calls remembered along one chain (a base further back is not offered).
MAX_LINKS = 256
#: Request keys whose list is a conversation history, the first one a request has taken: chat/Messages
#: ``messages``, Responses ``input``, and before it the earlier conversation the gateway resolved a
#: Responses ``previous_response_id`` to (``gateway.apis.responses_input.PREVIOUS_KEY``): that list
#: grows with every call while ``input`` holds only the new items, so chained on ``input`` every row
#: held the whole earlier conversation in its frame (O(calls x context) again).
HISTORY_KEYS = ("_harnessrl_previous_messages", "messages", "input")
#: The ``calls`` columns this module decides (the others are the call's own fields).
CHAIN_COLUMNS = (
    "prompt_token_ids",
    "prompt_base_seq",
    "prompt_len",
    "request",
    "request_key",
    "request_items",
    "request_base_seq",
    "request_base_items",
)
#: What migration 4 wrote (schema 4 has no ``request_base_items``: whole bases only).
CHAIN_COLUMNS_V4 = CHAIN_COLUMNS[:-1]

V = TypeVar("V", bytes, tuple[str, ...])


@dataclass(frozen=True, slots=True)
class Link:
    """One call on a chain: its value is the chain's ``value[:length]``."""

    length: int  # bytes of prompt + response token IDs, or number of history items
    seq: int
    frame: str | None = None  # request chains: the call's frame JSON


@dataclass(frozen=True, slots=True)
class Chain(Generic[V]):
    """Calls of one attempt, each extending the one before."""

    key: str | None  # request chains: the history key (only equal keys extend); token chains: None
    value: V  # the newest call's packed prompt + response tokens, or history item texts
    links: tuple[Link, ...]  # oldest first; the last is the newest call's
    nbytes: int  # what ``value`` and the links' frames hold, for the cache's bound


@dataclass(frozen=True, slots=True)
class AttemptChains:
    """A rollout attempt's chains as of its rollout's call ``last_seq`` (any attempt's)."""

    attempt: int
    last_seq: int
    tokens: tuple[Chain[bytes], ...] = ()  # most recently extended first
    requests: tuple[Chain[tuple[str, ...]], ...] = ()

    def continues(self, attempt: int, seq: int) -> bool:
        """Whether these chains know every call before ``seq`` (no other writer came between)."""
        return self.attempt == attempt and self.last_seq == seq - 1

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.tokens) + sum(c.nbytes for c in self.requests)


@dataclass(frozen=True, slots=True)
class PackedCall:
    """A call encoded but for what depends on earlier calls: packing the prompt and JSON-encoding
    the history are the slow part, done before the write transaction."""

    columns: dict[str, Any]  # the row's other columns (``call_id`` set, ``seq`` not yet)
    prompt: bytes
    response: bytes
    key: str | None
    frame: str
    items: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class EncodedItems:
    """A request's history list with each item's compact JSON, as its caller encoded them already (the
    gateway does, to compare each request with the one before): ``pack_call`` takes these texts
    instead of encoding every item again. They describe only that very list (``items``, compared by
    identity) and must be what ``dump_call_json`` gives for each item (orjson's compact JSON)."""

    items: list[Any]
    texts: tuple[str, ...]


def split_request(
    request: Mapping[str, Any], encoded: EncodedItems | None = None
) -> tuple[str | None, str, tuple[str, ...]]:
    """A request's history key, frame JSON and history item texts (see the module docstring)."""
    key = next((k for k in HISTORY_KEYS if isinstance(request.get(k), list)), None)
    if key is None:
        return None, dump_call_json(request), ()
    history = request[key]
    if encoded is not None and encoded.items is history and len(encoded.texts) == len(history):
        items = encoded.texts
    else:
        items = tuple(map(dump_call_json, history))
    # {**request, key: None} keeps the key in its place, so the frame restores the key order.
    return key, dump_call_json({**request, key: None}), items


def pack_call(call: Call, encoded: EncodedItems | None = None) -> PackedCall:
    """Everything of a call's row that does not depend on earlier calls; a new ``call_id`` if it has none.
    ``encoded``: the request's history items as the caller encoded them (``EncodedItems``)."""
    check_keys(
        rollout_id=call.rollout_id, call_id=call.call_id, api=call.api, finish_reason=call.finish_reason
    )
    check_ints(attempt=call.attempt, policy_version=call.policy_version)
    key, frame, items = split_request(call.request, encoded)
    columns = {
        "call_id": call.call_id or uuid.uuid4().hex,
        "rollout_id": call.rollout_id,
        "attempt": call.attempt,
        "api": call.api,
        "response": dump_call_json(call.response),
        "response_token_ids": pack_ints(call.response_token_ids),
        "response_logprobs": pack_floats(call.response_logprobs),
        "policy_version": call.policy_version,
        "finish_reason": call.finish_reason,
        # Its fields as they are (plain values, no aliases): what model_dump gives, without its cost.
        "usage": None if call.usage is None else dump_call_json(dict(call.usage.__dict__)),
        "started_at": call.started_at,
        "first_token_at": call.first_token_at,
        "finished_at": call.finished_at,
    }
    prompt = pack_ints(call.prompt_token_ids)
    return PackedCall(columns, prompt, columns["response_token_ids"], key, frame, items)


def place(
    packed: PackedCall, seq: int, chains: AttemptChains, *, partial: bool = True
) -> tuple[dict[str, Any], AttemptChains]:
    """The row of call ``seq`` stored on the longest bases ``chains`` offer, and the chains after it.

    ``partial=False``: request bases are whole calls only (schema 4, which migration 4 writes)."""
    row = {**packed.columns, "seq": seq, "prompt_len": len(packed.prompt) // 4, "request_key": packed.key}
    whole = packed.prompt + packed.response
    found = _longest_base(chains.tokens, None, packed.prompt, _shared_bytes, partial=False)
    link = None if found is None else chains.tokens[found[0]].links[found[1]]
    row["prompt_base_seq"] = None if link is None else link.seq
    row["prompt_token_ids"] = packed.prompt if link is None else packed.prompt[link.length :]
    tokens = _extend(chains.tokens, found, None, whole, Link(len(whole), seq))

    requests = chains.requests
    row["request_base_seq"], row["request"], row["request_items"] = None, packed.frame, None
    row["request_base_items"] = None
    if packed.key is not None:
        found = _longest_base(requests, packed.key, packed.items, _shared_items, partial=partial)
        items, start, frame = packed.items, 0, packed.frame
        if found is not None:
            base, link = requests[found[0]], requests[found[0]].links[found[1]]
            start, row["request_base_seq"] = found[2], link.seq
            if start < link.length:
                row["request_base_items"] = start
            items = base.value[:start] + packed.items[start:]  # the base's texts: one copy in memory
            if link.frame == packed.frame:
                row["request"], frame = SAME_FRAME, link.frame  # likewise the frame
        row["request_items"] = "\n".join(packed.items[start:])
        requests = _extend(requests, found, packed.key, items, Link(len(items), seq, frame))
    return row, AttemptChains(chains.attempt, seq, tokens, requests)


def chains_from_rows(rows: Iterable[Row], attempt: int, last_seq: int) -> AttemptChains:
    """The chains of one attempt rebuilt from its stored rows (``seq`` order), as the writer of those
    rows had them: each row extends the chain holding its stored base."""
    chains = AttemptChains(attempt, last_seq)
    for row, unfolded in unfold_rows(rows):
        seq = row["seq"]
        whole, items = unfolded.tokens, unfolded.items
        token_base = _find(chains.tokens, row["prompt_base_seq"], None)
        tokens = _extend(chains.tokens, token_base, None, whole, Link(len(whole), seq))
        requests = chains.requests
        if unfolded.key is not None:  # frames and item texts of a base are shared objects already
            own = Link(len(items), seq, unfolded.frame)
            base = _find(requests, row["request_base_seq"], row["request_base_items"])
            requests = _extend(requests, base, unfolded.key, items, own)
        chains = AttemptChains(attempt, last_seq, tokens, requests)
    return chains


# -- chains ---------------------------------------------------------------------------------------


def _shared_bytes(new: bytes, value: bytes) -> int:
    """How many leading bytes of ``value`` ``new`` starts with."""
    if new.startswith(value):
        return len(value)  # the common case, one memcmp
    lo, hi = 0, min(len(new), len(value))  # new[:lo] == value[:lo]; they differ before hi + 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if new[lo:mid] == value[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _shared_items(new: tuple[str, ...], value: tuple[str, ...]) -> int:
    """How many leading items of ``value`` ``new`` starts with."""
    if new[: len(value)] == value:
        return len(value)
    # One is a prefix of the other, or they differ at the first unequal pair.
    return next(
        (i for i, (a, b) in enumerate(zip(new, value, strict=False)) if a != b), min(len(new), len(value))
    )


#: A base on ``chains``: (chain index, link index, how many of the link's items or bytes are used).
Base = tuple[int, int, int]


def _longest_base(
    chains: tuple[Chain[V], ...], key: str | None, new: V, shared: Callable[[V, V], int], *, partial: bool
) -> Base | None:
    """The call on ``chains`` that ``new`` shares the most leading items (or bytes) with: the longest
    whose whole value is a prefix of ``new``, or, with ``partial``, the leading part of a longer call
    where that part is longer. A whole call wins a tie, and the most recently extended chain."""
    best, best_used = None, -1
    for i, chain in enumerate(chains):
        if chain.key != key:
            continue
        n = shared(new, chain.value)
        j = bisect.bisect_right(chain.links, n, key=lambda link: link.length) - 1
        if j >= 0 and chain.links[j].length > best_used:
            best, best_used = (i, j, chain.links[j].length), chain.links[j].length
        if partial and j + 1 < len(chain.links) and n > max(best_used, 0):
            best, best_used = (i, j + 1, n), n  # the first n items of a call longer than n
    return best


def _find(chains: tuple[Chain[V], ...], seq: int | None, used: int | None) -> Base | None:
    """Call ``seq`` on ``chains`` as a base of which ``used`` items are used (``None``: all), if they
    still hold it."""
    if seq is not None:
        for i, chain in enumerate(chains):
            for j, link in enumerate(chain.links):
                if link.seq == seq:
                    return i, j, link.length if used is None else used
    return None


def _extend(
    chains: tuple[Chain[V], ...], base: Base | None, key: str | None, value: V, link: Link
) -> tuple[Chain[V], ...]:
    """``chains`` after the call of ``link`` (with ``value``) was stored on ``base``: the newest call
    of a chain is replaced by the call that extends it; a call extending an older link, or only the
    leading part of one, branches off (and both stay, for a retry to find its base), keeping the
    links within the part it shares; no base starts a chain. The oldest are dropped."""
    rest, links = chains, (link,)
    if base is not None:
        i, j, used = base
        kept = chains[i].links[: j + 1]
        if used < kept[-1].length:  # a partial base: only calls within the shared part are prefixes
            kept = kept[: bisect.bisect_right(kept, used, key=lambda k: k.length)]
        elif j == len(chains[i].links) - 1:
            rest = chains[:i] + chains[i + 1 :]
        links = (kept + links)[-MAX_LINKS:]
    return (Chain(key, value, links, _nbytes(value, links)), *rest)[:MAX_CHAINS]


def _nbytes(value: bytes | tuple[str, ...], links: tuple[Link, ...]) -> int:
    """What a chain holds: its value, and its links' frames (one string where they are equal)."""
    if isinstance(value, bytes):
        return len(value)
    frames = {id(link.frame): link.frame for link in links if link.frame is not None}
    return sum(map(len, value)) + sum(map(len, frames.values()))


# -- the writer's memory ----------------------------------------------------------------------------


class ChainCache:
    """Each rollout's ``AttemptChains`` as its last write left them; least recently written rollouts
    are dropped past ``max_bytes``. Only a shortcut: a missing or stale entry is rebuilt from rows."""

    def __init__(self, max_bytes: int = 64 * 2**20) -> None:
        self.max_bytes = max_bytes
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, AttemptChains] = OrderedDict()
        self._bytes = 0

    def _check_fork(self) -> None:
        # A forked child starts empty with a new lock: a parent thread may have held the old one.
        if self._pid != os.getpid():
            self._reset()

    def get(self, rollout_id: str) -> AttemptChains | None:
        self._check_fork()
        with self._lock:
            return self._entries.get(rollout_id)

    def put(self, entries: Mapping[str, AttemptChains]) -> None:
        """Remember chains after their rows were committed (never before: a rolled-back row must
        not become a base)."""
        self._check_fork()
        with self._lock:
            for rollout_id, chains in entries.items():
                old = self._entries.pop(rollout_id, None)
                self._bytes -= 0 if old is None else old.nbytes
                self._entries[rollout_id] = chains
                self._bytes += chains.nbytes
            while self._bytes > self.max_bytes and self._entries:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped.nbytes
