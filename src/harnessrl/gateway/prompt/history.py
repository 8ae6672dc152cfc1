"""Per-rollout memory of answered chat calls, for sampled-token reuse (``conversation.build_prompt``).

In memory for speed, but never the source of truth: after a gateway restart a rollout's memory is
rebuilt lazily from ``store.list_calls`` (the stored request messages, answered message and token
IDs are all reuse needs). Entries are keyed by (rollout, attempt) so a retried rollout never
splices in tokens of an abandoned attempt. Least-recently-used rollouts are forgotten past a cap.

The gateway's ``SpliceTrust`` (how far incremental prompt splices are verified) lives here too.

Each memory also keeps the rollout's last request's keyed messages (``messages.key_messages``),
so the next request normalizes and fingerprints only the messages it adds.

Each remembered call carries the ``template_key`` of its tools and template kwargs: a call made
with other tools never lends its tokens. The API's handler notes the key it computed for a request
(``RolloutMemory.note_template_key``, from the JSON the tokenizer keeps its tools by: no encoding),
and recording takes it from there; a call loaded from the store, or one whose note is gone, gets
it from its stored request (``apis.template_context``: one encoding of its tools).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from harnessrl.errors import HarnessRLError
from harnessrl.gateway.apis import internal_conversation, template_context
from harnessrl.gateway.bodies import CheckedRest
from harnessrl.gateway.prompt.conversation import SpliceTrust, prompt_template_key
from harnessrl.gateway.prompt.messages import (
    KeyedMessages,
    PriorCall,
    TemplateKey,
    key_messages,
    template_key,
)
from harnessrl.gateway.prompt.repeats import HistoryBytes, history_bytes
from harnessrl.schemas import Call
from harnessrl.store.base import Store

if TYPE_CHECKING:
    from harnessrl.tokenizer import PolicyTokenizer

log = logging.getLogger("harnessrl.gateway")

Key = tuple[str, int]

#: Priors per rollout attempt that keep their tokens' encodings: the main agent's newest call and
#: a few subagents' (each is the base of the next prompt on its chain).
ENCODED_PRIORS = 4
#: Requests of one rollout whose template key waits for their record (calls in flight at once).
NOTED_KEYS = 8


@dataclass
class RolloutMemory:
    priors: dict[int, PriorCall] = field(default_factory=dict)  # by call seq
    recorded: set[int] = field(default_factory=set)  # seqs of this attempt's calls in the store
    in_flight: int = 0
    loaded: bool = False
    last_keyed: KeyedMessages | None = None  # the last request's messages, a cache for the next one
    last_rest: CheckedRest | None = None  # what the last request's checks made of the rest of its body
    # The rollout's call count in the store (all attempts) as of the last load, plus calls recorded
    # here since: with peer gateways, a larger count in the store means this memory is stale.
    store_calls: int = 0
    # The newest priors, which keep their prompts' encodings (``TokenIds``) for the next prompts
    # spliced from them; older ones drop theirs (a prompt 16 k tokens long keeps ~170 KB of them).
    encoded: deque[PriorCall] = field(default_factory=lambda: deque(maxlen=ENCODED_PRIORS))
    last_template_key: TemplateKey | None = None  # the newest prior's, shared by the next (``sharing_key``)
    # id of a request body -> (the body, its template key), as its handler computed it for the record.
    noted_keys: OrderedDict[int, tuple[dict[str, Any], TemplateKey]] = field(default_factory=OrderedDict)

    def template_tools(
        self,
        tokenizer: PolicyTokenizer,
        request: dict[str, Any],
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any] | None,
        *,
        known: CheckedRest | None = None,
    ) -> Any:
        """``tokenizer.template_tools(tools)``, what the prompt is rendered with (the pipeline's own
        call then finds them prepared), noting the template key of ``request`` for its record.

        ``known``: the rollout's last request's checks, where everything of this body but its history
        list (tools included) is the same JSON as that one's: its prepared tools are these tools',
        taken as they are (a rollout's requests repeat their tools, and preparing them walks the list
        and encodes it again on every call)."""
        prepared = known.tools if known is not None else tokenizer.template_tools(tools)
        self.note_template_key(request, prompt_template_key(tokenizer, prepared, kwargs))
        return prepared

    def note_template_key(self, request: dict[str, Any], key: TemplateKey) -> None:
        """Keep the template key of ``request`` (the body that will be ``Call.request``) for its
        record; the oldest note goes past ``NOTED_KEYS`` (a call that failed is never recorded)."""
        self.noted_keys[id(request)] = (request, key)
        if len(self.noted_keys) > NOTED_KEYS:
            self.noted_keys.popitem(last=False)

    def template_key_of(self, call: Call) -> TemplateKey:
        """The template key of a call being recorded: its handler's note, else from its request."""
        noted = self.noted_keys.pop(id(call.request), None)
        if noted is not None and noted[0] is call.request:
            return noted[1]
        return call_template_key(call)

    def remember(self, seq: int, prior: PriorCall) -> None:
        """Keep ``prior`` for reuse; the oldest of the encoded priors forgets its encodings."""
        prior = self.sharing_key(prior)
        self.priors[seq] = prior
        if len(self.encoded) == ENCODED_PRIORS:
            self.encoded[0].prompt.forget_encodings()
        self.encoded.append(prior)

    def sharing_key(self, prior: PriorCall) -> PriorCall:
        """``prior`` holding the objects of the last kept template key if it equals that one: a
        rollout's calls mostly share their tools, which are then held once (a 30 KB tool list per
        call adds up) and compared by identity."""
        last = self.last_template_key
        if last is not None and last is not prior.template_key and last == prior.template_key:
            return replace(prior, template_key=last)
        self.last_template_key = prior.template_key
        return prior

    def repeats(self, raw: Any) -> tuple[HistoryBytes, int] | None:
        """``repeats.history_bytes`` of a new request's history list against the last request's:
        what it repeats needs no checking again. ``None`` if ``raw`` is not a list or not encodable."""
        if not isinstance(raw, list):
            return None
        return history_bytes(raw, self.last_keyed.history if self.last_keyed is not None else None)

    def key_messages(
        self, raw: Sequence[Any], repeated: tuple[HistoryBytes, int] | None = None
    ) -> KeyedMessages:
        """``messages.key_messages`` for a new request of this rollout, remembered for the next
        (``repeated``: what ``repeats`` gave for ``raw``)."""
        keyed = key_messages(raw, self.last_keyed, repeated)
        self.last_keyed = keyed
        return keyed

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


def call_template_key(call: Call) -> TemplateKey:
    """``messages.template_key`` of a stored call: the tools and template kwargs of its request."""
    return template_key(*template_context(call.api, call.request))


def prior_from_call(call: Call) -> PriorCall | None:
    """The reuse entry of a stored call, or ``None`` for calls reuse cannot use."""
    try:
        conversation = internal_conversation(call.api, call.request)
        if conversation is None:
            return None
        messages, _tools = conversation
        return PriorCall.from_call(
            messages,
            call.response,
            call.prompt_token_ids,
            call.response_token_ids,
            call_template_key(call),
        )
    except (HarnessRLError, KeyError, TypeError, AttributeError):
        log.warning("call %s/%d cannot be used for reuse", call.rollout_id, call.seq)
        return None


class CallHistory:
    """``check_store``: other gateways write into the same store (``gateway.control.cluster``), so a rollout's
    memory may lack calls they served; each ``get`` then compares the store's call count with what the
    memory accounts for and loads the missing calls (one ``count_calls`` query per call)."""

    def __init__(self, store: Store, max_rollouts: int = 4096, *, check_store: bool = False) -> None:
        self._store = store
        self._max = max_rollouts
        self._check_store = check_store
        self._memories: OrderedDict[Key, RolloutMemory] = OrderedDict()
        self._locks: dict[Key, asyncio.Lock] = {}
        # How far this gateway has verified incremental prompt splices with its tokenizer.
        self.trust = SpliceTrust()

    async def get(self, rollout_id: str, attempt: int) -> RolloutMemory:
        key = (rollout_id, attempt)
        memory = self._memory(key)
        stale = False
        if memory.loaded:
            if not self._check_store:
                return memory
            count = await anyio.to_thread.run_sync(lambda: self._store.count_calls(rollout_id))
            if count == memory.store_calls:
                return memory
            stale = True
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if not memory.loaded or stale:
                # Count first: a call recorded between the two reads makes the next get load again.
                if self._check_store:
                    memory.store_calls = await anyio.to_thread.run_sync(
                        lambda: self._store.count_calls(rollout_id)
                    )
                calls = await anyio.to_thread.run_sync(
                    lambda: self._store.list_calls(rollout_id, attempt=attempt)
                )
                for call in calls:
                    memory.recorded.add(call.seq)
                    prior = prior_from_call(call)
                    # Calls recorded while we were loading are already here; keep them.
                    if prior is not None and call.seq not in memory.priors:
                        memory.priors[call.seq] = memory.sharing_key(prior)
                memory.loaded = True
        self._locks.pop(key, None)
        return memory

    def record(self, call: Call, message_keys: Sequence[bytes] | None = None) -> None:
        """Remember a call just added to the store (``seq`` assigned).

        ``message_keys``: the keys of the call's request messages when the caller already has them
        (``RolloutMemory.key_messages``), which spares normalizing the whole history again.
        """
        memory = self._memory((call.rollout_id, call.attempt))
        if call.seq not in memory.recorded:
            memory.store_calls += 1
        memory.recorded.add(call.seq)
        if message_keys is not None:
            try:
                context = memory.template_key_of(call)
            except (HarnessRLError, TypeError):  # as ``prior_from_call``: a request reuse cannot read
                log.warning("call %s/%d cannot be used for reuse", call.rollout_id, call.seq)
                return
            prior: PriorCall | None = PriorCall.from_keys(
                message_keys, call.response, call.prompt_token_ids, call.response_token_ids, context
            )
        else:
            prior = prior_from_call(call)
        if prior is not None:
            memory.remember(call.seq, prior)

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
