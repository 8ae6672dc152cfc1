"""The life of one model call, shared by every provider API: admit, generate, record.

Order matters and is the same for every API: authenticate and validate, tokenize (before the
pause gate, so a paused gateway still answers bad requests at once), wait at the gate, generate,
then make the call durable in the store, and only then hand the client the full answer. A call
whose client went away before the end, whose client read too slowly, or whose rollout ended first
is dropped (``delivery``): cancelled wherever it is, not recorded, counted. No one saw its answer,
so no later call can build on it and no trainer may train on it.

The OpenAI-shaped APIs (chat and legacy completions) also share their ends here: the answer
envelope, usage, the non-streaming "generate, record, answer" tail and the streaming response.
JSON is written with orjson: the answers carry hundreds of logprob entries, and ``json.dumps``
costs a large share of a call's CPU at that size.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import orjson
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from harnessrl.engines.base import GenerationContext, SamplingParams
from harnessrl.errors import BadRequest, ContextLengthExceeded, HarnessRLError, PayloadTooLarge
from harnessrl.gateway.auth import open_rollout
from harnessrl.gateway.bodies import SamplingFields
from harnessrl.gateway.conversation import KeyedMessages, PromptPlan, build_prompt, quick_prompt
from harnessrl.gateway.delivery import CallStream, DropReason, respond_whole
from harnessrl.gateway.errors import RolloutClosed, error_shape, internal_error, sse_error
from harnessrl.gateway.generation import Generation
from harnessrl.gateway.history import RolloutMemory
from harnessrl.gateway.pause import Ticket
from harnessrl.gateway.repeats import HistoryBytes
from harnessrl.gateway.state import GatewayState
from harnessrl.schemas import Call, Rollout, RolloutStatus, SamplingOverrides, Usage, now
from harnessrl.store.base import RolloutEnded
from harnessrl.store.chains import EncodedItems

if TYPE_CHECKING:
    from harnessrl.gateway.coalesce import Outlet

log = logging.getLogger("harnessrl.gateway")


def rollout_sampling(rollout: Rollout | None) -> SamplingOverrides:
    """The rollout's sampling overrides; ``BadRequest`` naming the field if they are malformed."""
    if rollout is None:
        return SamplingOverrides()
    try:
        return rollout.sampling
    except ValidationError as exc:
        raise BadRequest(
            f"rollout {rollout.rollout_id!r} has invalid metadata.sampling: {exc.errors()[0]['msg']}",
            param="metadata.sampling",
        ) from None


def sampling_params(
    state: GatewayState,
    body: SamplingFields,
    prompt_len: int,
    requested_max: int | None,
    rollout: Rollout | None = None,
) -> SamplingParams:
    """Sampling settings for the engine; 400 if the prompt plus ``max_tokens`` cannot fit the context.

    A rollout may carry ``SamplingOverrides`` set by whoever created it (the trainer): its
    ``temperature`` / ``top_p`` replace the harness's, and its ``max_tokens`` caps the harness's.
    That is how training runs sample at the temperature the trainer's logprobs assume and how
    evaluations run greedy, whatever the unmodified harness asks for.
    """
    overrides = rollout_sampling(rollout)
    for cap in (overrides.max_tokens, state.config.max_tokens):
        if cap is not None:
            requested_max = cap if requested_max is None else min(requested_max, cap)
    temperature = 1.0 if body.temperature is None else body.temperature
    if overrides.temperature is not None:
        temperature = overrides.temperature
    top_p = 1.0 if body.top_p is None else body.top_p
    if overrides.top_p is not None:
        top_p = overrides.top_p
    context = state.engine.context_length
    room = context - prompt_len
    if room <= 0:
        raise ContextLengthExceeded(
            f"the prompt has {prompt_len} tokens; this model's context length is {context}", param="messages"
        )
    if requested_max is not None:
        if requested_max > room:
            raise ContextLengthExceeded(
                f"the prompt has {prompt_len} tokens and max_tokens is {requested_max}; together they exceed "
                f"this model's context length of {context}",
                param="max_tokens",
            )
        max_tokens = requested_max
    else:
        max_tokens = min(room, state.config.default_max_tokens or room)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        stop_token_ids=tuple(state.engine.tokenizer.stop_token_ids),
        seed=body.seed,
    )


#: Characters of request text per token of context the gateway tokenizes by default
#: (``gateway.max_prompt_chars`` unset): English averages about 4 per token, and a prompt of 16 per
#: token of the context can hardly fit it.
CHARS_PER_CONTEXT_TOKEN = 16


def prompt_char_limit(state: GatewayState) -> int:
    return state.config.max_prompt_chars or CHARS_PER_CONTEXT_TOKEN * state.engine.context_length


T = TypeVar("T")


async def tokenize_in_thread(state: GatewayState, fn: Callable[[], T], param: str) -> T:
    """Render and encode a prompt in a worker thread, within ``gateway.tokenize_timeout_s``.

    The size cap (``check_prompt_size``) bounds the text; the time budget bounds what the size cap
    cannot see (a template that loops over a long history, a tokenizer that is slow on some text).
    Past it the client gets a 413 and the event loop moves on; the thread cannot be stopped and
    finishes in the background, its result dropped.
    """
    budget = state.config.tokenize_timeout_s
    try:
        with anyio.fail_after(budget):
            return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True)
    except TimeoutError:
        raise PayloadTooLarge(
            f"the prompt took more than {budget:g} s to tokenize (gateway.tokenize_timeout_s)",
            param=param,
        ) from None


async def plan_prompt(
    state: GatewayState,
    keyed: KeyedMessages,
    memory: RolloutMemory,
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any] | None,
) -> PromptPlan:
    """The prompt of a keyed conversation (``conversation.build_prompt``, sampled-token reuse):
    a trusted incremental splice on the event loop (``quick_prompt``), anything that renders the
    whole conversation in a thread (it takes milliseconds on a long one). Chat and Messages share it."""
    tokenizer = state.engine.tokenizer
    priors = list(memory.priors.values())
    history = state.config.history
    tools = tokenizer.template_tools(tools)  # prepared once for every render of this call
    plan = quick_prompt(
        tokenizer,
        keyed.messages,
        priors,
        keyed.keys,
        tools=tools,
        template_kwargs=template_kwargs,
        history=history,
    )
    if plan is not None:
        return plan
    return await tokenize_in_thread(
        state,
        lambda: build_prompt(
            tokenizer,
            keyed.messages,
            priors,
            tools=tools,
            template_kwargs=template_kwargs,
            keys=keyed.keys,
            history=history,
        ),
        "messages",
    )


def check_prompt_size(
    state: GatewayState,
    data: Any,
    param: str,
    history: HistoryBytes | None = None,
    rest_chars: int | None = None,
) -> int:
    """413 if the request carries more text than the gateway tokenizes for one call.

    Checked before anything is rendered or encoded: tokenizing an 8 MiB prompt took seconds of a
    worker thread and held the event loop up (``/api/health`` stalled for as long). Counts the
    characters of every string in the body (contents, tool definitions, arguments), in a loop
    rather than recursion, and stops as soon as the limit is passed.

    ``history``: the body's ``data[param]`` list as ``repeats.history_bytes`` encoded it, which has
    its count already; ``rest_chars``: the count of everything else, where known (the rest of the
    body is the same JSON as the last request's). Returns that count (0 without ``history``).
    """
    limit = prompt_char_limit(state)
    if history is None:
        _count_text(data, 0, limit, param)
        return 0
    listed = history.text_chars(len(history.ends))
    if rest_chars is None:
        rest_chars = _count_text([v for k, v in data.items() if k != param], listed, limit, param) - listed
    _count_text(None, listed + rest_chars, limit, param)
    return rest_chars


def _count_text(node: Any, total: int, limit: int, param: str) -> int:
    """``total`` plus the characters of every string in ``node``; ``PayloadTooLarge`` past ``limit``."""
    stack = [node]
    while True:
        if total > limit:
            raise PayloadTooLarge(
                f"the request has more than {limit} characters of text, the most this gateway "
                "tokenizes for one call (gateway.max_prompt_chars)",
                param=param,
            )
        if not stack:
            return total
        node = stack.pop()
        if isinstance(node, str):
            total += len(node)
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def check_token_ids(state: GatewayState, ids: list[int]) -> None:
    limit = state.engine.tokenizer.vocab_size
    bad = next((t for t in ids if not 0 <= t < limit), None)
    if bad is not None:
        raise BadRequest(f"token id {bad} is outside the vocabulary (0..{limit - 1})", param="prompt")


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
    def committed(self) -> bool:
        """Whether the call's record has begun (then it is answered, never dropped)."""
        return self.stored is not None or self._recording

    async def closed_error(self) -> RolloutClosed:
        """The 409 of a call whose rollout ended, naming how (as ``auth.open_rollout`` words it)."""
        rollout_id = self.rollout.rollout_id
        try:
            rollout = await self.state.in_thread(self.state.store.get_rollout, rollout_id)
            status = rollout.status.value
            if rollout.status is RolloutStatus.QUEUED:
                status = f"queued again (attempt {rollout.attempt})"
        except HarnessRLError:
            status = "ended"
        return RolloutClosed(f"rollout {rollout_id!r} is {status}; it takes no more calls")

    async def admit(self, *, keepalive: bool = False) -> AsyncIterator[str]:
        """Wait at the pause gate; yields SSE keep-alive comments while waiting if asked to."""
        state = self.state
        self._ticket = state.gate.join()
        state.refresh_gauges()
        began = now()
        if not self._ticket.admitted:
            while not await self._ticket.wait(state.keepalive_s if keepalive else None):
                yield ": waiting for the gateway to resume\n\n"
            # The rollout may have been finished or cancelled while we waited.
            self.rollout = await open_rollout(
                state, await state.in_thread(state.store.get_rollout, self.rollout.rollout_id)
            )
        self._waited_s = now() - began
        state.metrics.pause_wait.observe(self._waited_s)
        state.refresh_gauges()

    def start(self, *, stream: bool = True) -> Generation:
        """Create the generation; reads the call index now so concurrent calls get distinct ones.

        ``stream=False``: the client gets the answer whole, so the engine need not stream it.
        """
        index = self.memory.begin_call()
        context = GenerationContext(rollout_id=self.rollout.rollout_id, call_index=index, stream=stream)
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
            usage=Usage(
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
        # Shielded: once the write starts, finish it and remember it even if the client just left.
        self._recording = True
        with anyio.CancelScope(shield=True):
            return await self._store(call)

    async def _store(self, call: Call) -> Call:
        state = self.state
        encoded = None
        messages = call.request.get("messages")
        if self.history is not None and isinstance(messages, list):
            encoded = EncodedItems(messages, self.history.texts())
        try:
            stored = await state.writer.add(call, encoded)  # committed, maybe with other calls (group commit)
        except RolloutEnded:
            # Ended by someone this gateway did not hear (another process): refused, as it must be.
            self._recording = False
            self.drop_reason = "rollout_ended"
            raise await self.closed_error() from None
        # Synchronously after the write: the next call of this rollout must see it for reuse, and
        # must not count it as still generating (a harness sends it the moment the answer ends,
        # before this call's ``finish``, which runs after the last byte, has run).
        state.history.record(stored, self.message_keys)
        self._end_generation()
        self.stored = stored
        m = state.metrics
        m.child(m.calls, self.api, stored.finish_reason).inc()
        m.prompt_tokens.inc(len(stored.prompt_token_ids))
        m.completion_tokens.inc(len(stored.response_token_ids))
        if call.finished_at is not None:
            m.child(m.latency, self.api).observe(call.finished_at - call.started_at)
        if call.first_token_at is not None:
            m.child(m.first_token, self.api).observe(call.first_token_at - call.started_at)
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
        state.refresh_gauges()

    def headers(self) -> dict[str, str]:
        out = {"x-harnessrl-rollout-id": self.rollout.rollout_id}
        if self.stored is not None:
            out["x-harnessrl-call-seq"] = str(self.stored.seq)
            out["x-harnessrl-policy-version"] = str(self.stored.policy_version)
        return out


async def run_to_end(call: PreparedCall) -> None:
    """Non-streaming: wait at the gate, then generate to the end.

    The engine is told it need not stream unless stop strings are set: those are found in the text
    as it grows and end the generation early, which saves the engine the rest.
    """
    async for _ in call.admit():
        pass
    await call.start(stream=bool(call.stop)).run()


def _dumps(data: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(data)
    except TypeError:  # what orjson refuses (integers past 64 bits): the slower, lenient json
        return json.dumps(data, ensure_ascii=False).encode()


def sse(data: dict[str, Any]) -> str:
    return "data: " + _dumps(data).decode() + "\n\n"


def json_response(payload: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    """A JSON answer (orjson: UTF-8, compact; what ``JSONResponse`` sends, several times faster)."""
    return Response(_dumps(payload), media_type="application/json", headers=headers)


# -- the ends the OpenAI-shaped APIs share (chat.completions, completions) ------------------------

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def openai_usage(call: PreparedCall) -> dict[str, int]:
    gen = call.generation
    completion = len(gen.token_ids) if gen else 0
    return {
        "prompt_tokens": len(call.prompt_ids),
        "completion_tokens": completion,
        "total_tokens": len(call.prompt_ids) + completion,
    }


def openai_envelope(id_prefix: str, obj: str, model: str, policy_version: int) -> dict[str, Any]:
    """The fields every OpenAI answer and stream chunk starts with."""
    return {
        "id": f"{id_prefix}-{secrets.token_hex(12)}",
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": f"harnessrl-policy-{policy_version}",
    }


async def generate_and_record(
    call: PreparedCall,
    request: Request,
    answer: Callable[[Generation], tuple[dict[str, Any], str]],
    reply: Callable[[Generation, dict[str, Any], str], Response],
) -> Response:
    """Non-streaming: wait at the gate, generate, and make the call durable before anyone answers.

    ``answer`` turns the finished generation into the recorded response and finish reason;
    ``reply`` builds the client's HTTP answer from them, before the record, so a call whose answer
    cannot be built (a 500) is not recorded either. Driven by ``delivery.respond_whole``: a client
    that leaves (or a rollout that ends) meanwhile cancels it.
    """

    async def work() -> Response:
        await run_to_end(call)
        gen = call.generation
        assert gen is not None
        response, finish = answer(gen)
        out = reply(gen, response, finish)
        await call.record(response, finish)
        return out

    return await respond_whole(call, request, work)


def streaming_response(
    call: PreparedCall, chunks: Callable[[], AsyncGenerator[str, None]], headers: dict[str, str] | None = None
) -> CallStream:
    """An SSE answer: ``chunks`` wrapped by ``sse_stream`` (gate keep-alives, errors, ``[DONE]``),
    driven by ``delivery.CallStream`` (drops, backpressure, events ready together sent in one write)."""
    return CallStream(
        call,
        sse_stream(call, chunks),
        closing=lambda exc: sse_error(exc),
        headers={**SSE_HEADERS, **call.headers(), **(headers or {})},
    )


def stream_error(call: PreparedCall, exc: Exception) -> HarnessRLError:
    """The error a failed stream ends with, as an event in the provider's shape (its 200 is sent).

    Ours as it is; anything else is logged once, with its traceback, and becomes an internal error
    (its class named, its message not leaked). Every stream builds what it sends after the record
    before recording, so a stream that fails was never recorded as answered.
    """
    if not isinstance(exc, HarnessRLError):
        log.error(
            "unexpected error in a %s stream of rollout %s",
            call.api,
            call.rollout.rollout_id,
            exc_info=exc,
        )
        exc = internal_error(exc)
    call.state.metrics.errors.labels(code=error_shape(exc).code).inc()
    return exc


async def sse_stream(call: PreparedCall, body: Callable[[], AsyncGenerator[str, None]]) -> AsyncIterator[str]:
    """Wrap an API's chunk generator: keep-alives at the gate, errors as SSE events, ``[DONE]``."""
    try:
        async for comment in call.admit(keepalive=True):
            yield comment
        chunks = body()
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            # Close the API's generator (and through it the engine's) even when the call is being
            # cancelled (a drop); shielded so the close itself is not cancelled.
            with anyio.CancelScope(shield=True):
                await chunks.aclose()
        yield "data: [DONE]\n\n"
    except Exception as exc:
        yield sse_error(stream_error(call, exc))
