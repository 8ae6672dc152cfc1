"""The life of one model call, shared by every provider API: admit, generate, record.

``PreparedCall`` is a call after ``pipeline.prepare`` validated and tokenized it; the pipeline
drives it through the gate, the generation and the record, and each API renders its answer.

Order matters and is the same for every API: authenticate and validate, tokenize (before the
pause gate, so a paused gateway still answers bad requests at once), wait at the gate, generate,
then make the call durable in the store, and only then hand the client the full answer. A call
whose client went away before the end, whose client read too slowly, or whose rollout ended first
is dropped (``delivery``): cancelled wherever it is, not recorded, counted. No one saw its answer,
so no later call can build on it and no trainer may train on it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from harnessrl.engines.base import GenerationContext, SamplingParams
from harnessrl.errors import GenerationAborted, HarnessRLError
from harnessrl.gateway.control.pause import Ticket
from harnessrl.gateway.errors import GatewayLapsed, GatewayStopping, RolloutClosed
from harnessrl.gateway.pipeline.delivery import DropReason
from harnessrl.gateway.pipeline.generation import Generation
from harnessrl.gateway.prompt.history import RolloutMemory
from harnessrl.gateway.prompt.repeats import HistoryBytes
from harnessrl.gateway.state import GatewayState
from harnessrl.schemas import Call, Rollout, RolloutStatus, Usage, now
from harnessrl.store.base import RolloutEnded
from harnessrl.store.chains import EncodedItems
from harnessrl.store.damage import RolloutUnreadable

if TYPE_CHECKING:
    from harnessrl.gateway.pipeline.coalesce import Outlet


def stopping_error() -> GatewayStopping:
    """The 503 of a call held at the gate when its gateway began to shut down (``GatewayState.stop``)."""
    return GatewayStopping(
        "this gateway is shutting down while paused: the call was not generated or recorded; "
        "send the request again"
    )


@dataclass(eq=False)  # compared and hashed by identity (kept in ``delivery.CallsInFlight``)
class PreparedCall:
    """A validated, tokenized call, ready to wait at the gate and generate."""

    state: GatewayState
    rollout: Rollout
    memory: RolloutMemory
    api: str
    request: dict[str, Any]
    prompt_ids: list[int]
    params: SamplingParams
    stop: list[str] = field(default_factory=list)
    # ``message_key``s of the request's messages when the API computed them (chat), so recording
    # the call does not normalize the whole history again.
    message_keys: tuple[bytes, ...] | None = None
    # ``request["messages"]`` as the API encoded it to compare it with the rollout's last request:
    # the store takes its items' JSON from it (``store.chains.EncodedItems``).
    history: HistoryBytes | None = None
    # How the prompt was built (``PromptPlan.result`` and ``reused_tokens``), kept in ``Call.usage``.
    prompt_source: str | None = None
    reused_prompt_tokens: int = 0
    generation: Generation | None = None
    stored: Call | None = None
    # Why the call was dropped (``delivery.DROP_REASONS``), once it was; it is then never recorded.
    drop_reason: DropReason | None = None
    # A streamed call's way to its client (``coalesce.Outlet``): the record waits for it to settle.
    outlet: Outlet | None = None
    _ticket: Ticket | None = None
    _waited_s: float = 0.0
    _scope: anyio.CancelScope | None = None  # what ``cancel`` cancels (``delivery``'s drivers)
    _recording: bool = False  # the store write has begun: the call is no longer dropped
    # ``Cluster.fence_mark()`` as the call was admitted: a lease that lapsed after that (while its
    # rollout was read or its prompt built, before generating) is a drain that may not have waited
    # for this call, as much as one during the generation.
    _fence: int | None = None

    def attach(self, scope: anyio.CancelScope) -> None:
        """Run under ``scope`` (a driver's), cancelled by ``cancel``; its rollout's end reaches it."""
        self._scope = scope
        self.state.calls.add(self)

    def cancel(self, reason: DropReason) -> None:
        """Drop the call for ``reason`` wherever it is (gate, generation, waiting for its client),
        unless its record has begun: a call being recorded is answered."""
        if self.committed or self.drop_reason is not None:
            return
        self.drop_reason = reason
        if self._scope is not None:
            self._scope.cancel()

    @property
    def held(self) -> bool:
        """Whether the call is waiting at the pause gate."""
        return self._ticket is not None and not self._ticket.admitted

    @property
    def committed(self) -> bool:
        """Whether the call's record has begun (then it is answered, never dropped)."""
        return self.stored is not None or self._recording

    async def closed_error(self, rollout: Rollout | None = None) -> RolloutClosed:
        """The 409 of a call whose rollout ended, naming how (as ``auth.open_rollout`` words it).
        ``rollout``: as just read from the store (else it is read here)."""
        rollout_id = self.rollout.rollout_id
        try:
            if rollout is None:
                rollout = await self.state.in_thread(self.state.store.get_rollout, rollout_id)
            status = rollout.status.value
            if rollout.status is RolloutStatus.QUEUED:
                status = f"queued again (attempt {rollout.attempt})"
            elif rollout.attempt != self.rollout.attempt:
                status = f"{status} as attempt {rollout.attempt} (this call's {self.rollout.attempt} ended)"
        except HarnessRLError:
            status = "ended"
        return RolloutClosed(f"rollout {rollout_id!r} is {status}; it takes no more calls")

    async def drop_error(self) -> HarnessRLError | None:
        """What a client still there is told about its call's drop: the 409 of an ended rollout, the
        503 of a gateway stopping; ``None`` where nobody is there to tell (its client left)."""
        if self.drop_reason == "rollout_ended":
            return await self.closed_error()
        if self.drop_reason == "gateway_stopping":
            return stopping_error()
        return None

    async def admit(self, *, keepalive: bool = False) -> AsyncIterator[str]:
        """Wait at the pause gate; yields SSE keep-alive comments while waiting if asked to."""
        state = self.state
        self._ticket = state.gate.join()
        began = now()
        if not self._ticket.admitted:
            if state.stopping:  # held calls are answered at once when the shutdown starts: so is this
                self.drop_reason = "gateway_stopping"
                raise stopping_error()
            while not await self._ticket.wait(state.keepalive_s if keepalive else None):
                yield ": waiting for the gateway to resume\n\n"
            self._fence = state.cluster.fence_mark()
            await self._still_open()
        else:
            self._fence = state.cluster.fence_mark()
        self._waited_s = now() - began
        state.metrics.pause_wait.observe(self._waited_s)

    async def _still_open(self) -> None:
        """After waiting at the gate: the rollout may have ended while we waited, or ended and been
        queued again as a new attempt (another process requeued it: this gateway heard of no end).
        Either way this call belongs to an attempt that is over: 409, dropped, never recorded; and the
        queued rollout is not started here, which would run the new attempt with no worker on it."""
        state = self.state
        try:
            rollout = await state.in_thread(state.store.get_rollout, self.rollout.rollout_id)
        except RolloutUnreadable:
            # Its row was damaged while the call waited: as ``auth.authorize_rollout`` answers a key
            # of such a row (the damage itself is the admin's to read, not the harness's).
            self.drop_reason = "rollout_ended"
            raise RolloutClosed(
                f"rollout {self.rollout.rollout_id!r} cannot be read (its record in the store is "
                "damaged); it takes no more calls"
            ) from None
        if (
            rollout.status is not RolloutStatus.RUNNING
            or rollout.attempt != self.rollout.attempt
            or rollout.api_key != self.rollout.api_key
        ):
            self.drop_reason = "rollout_ended"
            raise await self.closed_error(rollout)
        self.rollout = rollout

    def start(self, *, stream: bool = True) -> Generation:
        """Create the generation; reads the call index now so concurrent calls get distinct ones.

        ``stream=False``: the client gets the answer whole, so the engine need not stream it.
        """
        index = self.memory.begin_call()
        if self._fence is None:  # not admitted through ``admit`` (or no shared store: None again)
            self._fence = self.state.cluster.fence_mark()
        context = GenerationContext(
            rollout_id=self.rollout.rollout_id,
            call_index=index,
            stream=stream,
            stream_interval_s=self.state.config.stream_interval_s if stream else 0.0,
            stream_interval_tokens=self.state.config.stream_interval_tokens,
        )
        self.generation = Generation(self.state.engine, self.prompt_ids, self.params, self.stop, context)
        return self.generation

    async def record(self, response: dict[str, Any], finish_reason: str) -> Call:
        """Make the answered call durable; the client must not get the full answer before this returns."""
        gen = self.generation
        assert gen is not None, "record() before start()"
        # model_construct: every value is ours and already typed; validating a 16 k-token prompt
        # list again costs more than the rest of recording.
        call = Call.model_construct(
            rollout_id=self.rollout.rollout_id,
            attempt=self.rollout.attempt,
            api=self.api,
            request=self.request,
            response=response,
            prompt_token_ids=self.prompt_ids,
            response_token_ids=gen.token_ids,
            response_logprobs=gen.logprobs,
            policy_version=gen.policy_version,
            finish_reason=finish_reason,
            usage=Usage.model_construct(
                prompt_tokens=len(self.prompt_ids),
                completion_tokens=len(gen.token_ids),
                prompt_source=self.prompt_source,
                reused_prompt_tokens=self.reused_prompt_tokens,
            ),
            started_at=gen.started_at,
            first_token_at=gen.first_token_at,
            finished_at=gen.finished_at,
        )
        if self.outlet is not None:
            # A stream: what was sent so far must have reached the client (``coalesce.Outlet``).
            await self.outlet.settle()
        if self.state.cluster.lapsed_since(self._fence):
            self.drop_reason = "gateway_lapsed"
            raise GatewayLapsed(
                "this gateway stalled past its lease while generating the answer; a pause may have "
                "counted the gateways drained without it and the weights may have changed, so the "
                "answer is not recorded: send the request again"
            )
        if self.state.engine.policy_version != gen.policy_version:
            # A pause drains calls before the weights change, but a resume from elsewhere (another
            # run on the store, an admin) can open the gate while a trainer still loads weights: the
            # answer's tokens are then not all of the version it started with. Ended as an engine
            # cutting it short ends (503, the harness sends it again), not recorded under that version.
            raise GenerationAborted(
                f"the policy's weights changed from version {gen.policy_version} to "
                f"{self.state.engine.policy_version} while the answer was generated: send it again"
            )
        # Once the write starts, finish it and remember it even if the client just left: written at
        # once (``add_now``: no await, so nothing can cancel it), or in a shielded scope.
        self._recording = True
        encoded = None
        messages = call.request.get("messages")
        if self.history is not None and isinstance(messages, list):
            encoded = EncodedItems(messages, self.history.texts())
        writer = self.state.writer
        try:
            stored = writer.add_now(call, encoded)
        except RolloutEnded:
            stored = None
            ended = True
        else:
            ended = False
        if stored is None:
            with anyio.CancelScope(shield=True):
                if ended:
                    raise await self._refused() from None
                try:
                    stored = await writer.add_queued(call, encoded)  # maybe with other calls (group commit)
                except RolloutEnded:
                    raise await self._refused() from None
        return self._stored(call, stored)

    async def _refused(self) -> RolloutClosed:
        """A rollout ended by someone this gateway did not hear (another process): the store refused
        the call, as it must; it is dropped."""
        self._recording = False
        self.drop_reason = "rollout_ended"
        return await self.closed_error()

    def _stored(self, call: Call, stored: Call) -> Call:
        state = self.state
        # Synchronously after the write: the next call of this rollout must see it for reuse, and
        # must not count it as still generating (a harness sends it the moment the answer ends,
        # before this call's ``finish``, which runs after the last byte, has run).
        state.history.record(stored, self.message_keys)
        self._end_generation()
        self.stored = stored
        state.metrics.count_answered(self.api, call)  # its usage is its token counts
        return stored

    def _end_generation(self) -> None:
        """Leave the rollout's in-flight count (once: recording and ``finish`` both call it)."""
        if self.generation is not None and self.generation.context is not None:
            self.memory.end_call()
            self.generation.context = None

    def finish(self) -> None:
        """Leave the gate and the rollout's in-flight count, count a drop (always, in a ``finally``)."""
        self._end_generation()
        if self._ticket is not None:
            self._ticket.release()
            self._ticket = None
        state = self.state
        if self._scope is not None:
            self._scope = None
            state.calls.discard(self)
            if self.stored is None and self.drop_reason is not None:
                gen = self.generation
                state.count_drop(
                    self.rollout.rollout_id, self.api, self.drop_reason, gen.token_ids if gen else ()
                )

    def headers(self) -> dict[str, str]:
        out = {"x-harnessrl-rollout-id": self.rollout.rollout_id}
        if self.stored is not None:
            out["x-harnessrl-call-seq"] = str(self.stored.seq)
            out["x-harnessrl-policy-version"] = str(self.stored.policy_version)
        return out
