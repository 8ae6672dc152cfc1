"""Per-rollout memory of answered chat calls, for sampled-token reuse (``conversation.build_prompt``).

In memory for speed, but never the source of truth: after a gateway restart a rollout's memory is
rebuilt lazily from ``store.list_calls`` (the stored request messages, answered message and token
IDs are all reuse needs). Entries are keyed by (rollout, attempt) so a retried rollout never
splices in tokens of an abandoned attempt. Least-recently-used rollouts are forgotten past a cap.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, field

import anyio.to_thread

from harnessrl.errors import HarnessRLError
from harnessrl.gateway.apis import internal_conversation
from harnessrl.gateway.conversation import PriorCall
from harnessrl.schemas import Call
from harnessrl.store.base import Store

log = logging.getLogger("harnessrl.gateway")

Key = tuple[str, int]


@dataclass
class RolloutMemory:
    priors: dict[int, PriorCall] = field(default_factory=dict)  # by call seq
    recorded: set[int] = field(default_factory=set)  # seqs of this attempt's calls in the store
    in_flight: int = 0
    loaded: bool = False

    def begin_call(self) -> int:
        """Count a generation as started; returns its ``call_index`` (calls made before it).

        Recorded calls plus calls still generating: a call that failed or was abandoned is not
        counted, so its retry gets the same index (the scripted engine replays the same turn).
        """
        index = len(self.recorded) + self.in_flight
        self.in_flight += 1
        return index

    def end_call(self) -> None:
        self.in_flight -= 1


def prior_from_call(call: Call) -> PriorCall | None:
    """The reuse entry of a stored call, or ``None`` for calls reuse cannot use."""
    try:
        conversation = internal_conversation(call.api, call.request)
        if conversation is None:
            return None
        messages, _tools = conversation
        return PriorCall.from_call(messages, call.response, call.prompt_token_ids, call.response_token_ids)
    except (HarnessRLError, KeyError, TypeError, AttributeError):
        log.warning("call %s/%d cannot be used for reuse", call.rollout_id, call.seq)
        return None


class CallHistory:
    def __init__(self, store: Store, max_rollouts: int = 4096) -> None:
        self._store = store
        self._max = max_rollouts
        self._memories: OrderedDict[Key, RolloutMemory] = OrderedDict()
        self._locks: dict[Key, asyncio.Lock] = {}

    async def get(self, rollout_id: str, attempt: int) -> RolloutMemory:
        key = (rollout_id, attempt)
        memory = self._memory(key)
        if memory.loaded:
            return memory
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if not memory.loaded:
                calls = await anyio.to_thread.run_sync(
                    lambda: self._store.list_calls(rollout_id, attempt=attempt)
                )
                for call in calls:
                    memory.recorded.add(call.seq)
                    prior = prior_from_call(call)
                    # Calls recorded while we were loading are already here; keep them.
                    if prior is not None and call.seq not in memory.priors:
                        memory.priors[call.seq] = prior
                memory.loaded = True
        self._locks.pop(key, None)
        return memory

    def record(self, call: Call) -> None:
        """Remember a call just added to the store (``seq`` assigned)."""
        memory = self._memory((call.rollout_id, call.attempt))
        memory.recorded.add(call.seq)
        prior = prior_from_call(call)
        if prior is not None:
            memory.priors[call.seq] = prior

    def forget(self, rollout_id: str) -> None:
        for key in [k for k in self._memories if k[0] == rollout_id]:
            del self._memories[key]

    def _memory(self, key: Key) -> RolloutMemory:
        memory = self._memories.get(key)
        if memory is None:
            memory = self._memories[key] = RolloutMemory()
            while len(self._memories) > self._max:
                self._memories.popitem(last=False)
        else:
            self._memories.move_to_end(key)
        return memory
