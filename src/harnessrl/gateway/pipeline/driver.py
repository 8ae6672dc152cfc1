"""One driver for a model call, whatever provider API it speaks.

A provider API knows its own shapes and nothing else (``ProviderApi``): it parses a request body
into the common ``CallRequest``, names its context-length error, and gives each prepared call an
``Answer`` that renders the finished answer, the stream's events and an error in its shape. The
life of the call between is here, once, the same for chat, responses, messages and completions:

    authenticate -> read the body -> parse (the API) -> key the messages (a 400 before the rollout
    starts) -> open the rollout -> build the prompt -> sampling settings -> wait at the gate ->
    generate -> record -> answer, whole (``delivery.respond_whole``) or streamed
    (``streaming.sse_events`` under ``delivery.CallStream``)

What the API renders is ``answer.Answer``; the streamed call's own driver is ``streaming``.

The prompt is built with the fast path for every conversation API: the messages are keyed
incrementally against the rollout's last request (``RolloutMemory.key_messages``, with the byte
comparison ``repeats`` did when the API has it), a trusted splice runs on the event loop
(``quick_prompt``) and only a full render goes to a thread, and recording reuses the keys so the
store write does not normalize the whole history again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from harnessrl.errors import BadRequest, ContextLengthExceeded
from harnessrl.gateway.auth import authorize_rollout, open_rollout
from harnessrl.gateway.bodies import read_body
from harnessrl.gateway.body_models import SamplingFields
from harnessrl.gateway.pipeline.answer import Answer, Streamed, Whole
from harnessrl.gateway.pipeline.calls import PreparedCall
from harnessrl.gateway.pipeline.delivery import CallStream, respond_whole
from harnessrl.gateway.pipeline.generation import close_stream
from harnessrl.gateway.pipeline.limits import sampling_params, tokenize_in_thread
from harnessrl.gateway.pipeline.streaming import sse_events
from harnessrl.gateway.pipeline.wire import SSE_HEADERS
from harnessrl.gateway.prompt.conversation import PromptPlan, build_prompt, quick_prompt
from harnessrl.gateway.prompt.history import RolloutMemory
from harnessrl.gateway.prompt.messages import KeyedMessages
from harnessrl.gateway.prompt.repeats import HistoryBytes
from harnessrl.gateway.state import GatewayState
from harnessrl.schemas import Rollout

# The API modules take the answer's shapes from here too: the driver is the pipeline's face to them.
__all__ = ["Answer", "CallRequest", "ProviderApi", "Streamed", "Whole", "plan_prompt", "prepare", "serve"]

B = TypeVar("B", bound=SamplingFields)


@dataclass
class CallRequest(Generic[B]):
    """A request body as every API's becomes it: what the pipeline needs to run the call."""

    data: dict[str, Any]  # the body as recorded (``Call.request``)
    body: B  # the API's validated fields (sampling, ``stream``, its own)
    requested_max: int | None  # the answer's token budget the client asked for
    param: str  # the field a prompt problem is blamed on ("messages", "input", "prompt")
    # A conversation (chat, responses, messages): its messages in internal form, not yet keyed...
    messages: Sequence[Any] | None = None
    tools: list[dict[str, Any]] | None = None
    template_kwargs: dict[str, Any] | None = None
    # ...with ``repeats.history_bytes`` of them when the API compared them already (chat), and
    # whether they are the body's own ``messages`` list (then the store takes their JSON from it).
    repeated: tuple[HistoryBytes, int] | None = None
    messages_are_the_body: bool = False
    # Or a prompt of its own (completions): no template, no reuse.
    prompt_ids: list[int] | None = None


class ProviderApi(Protocol[B]):
    """A provider API: its own shapes, parsed in and rendered out."""

    #: ``Call.api`` of its calls.
    name: str

    async def parse(
        self, state: GatewayState, rollout: Rollout, memory: RolloutMemory, raw: bytes
    ) -> CallRequest[B]:
        """Validate the body and turn it into the common request (``BadRequest`` and friends)."""

    def too_long(
        self,
        state: GatewayState,
        exc: ContextLengthExceeded,
        request: CallRequest[B],
        prompt_len: int,
        rollout: Rollout,
    ) -> ContextLengthExceeded:
        """The context-length error as this API words it."""

    def answer(self, call: PreparedCall, request: CallRequest[B]) -> Answer:
        """The answer of a prepared call."""


async def serve(api: ProviderApi[Any], request: Request) -> Response:
    """Run one call of ``api`` from its HTTP request to its answer."""
    if (
        request.app.state.gateway.teacher is not None
    ):  # chat, Messages and Responses go to ``gateway.teacher``
        raise BadRequest(
            f"this gateway is in teacher mode: it serves chat.completions, messages and responses, not {api.name}"
        )
    call, parsed = await prepare(api, request)
    answer = api.answer(call, parsed)
    if parsed.body.stream:
        headers = {**SSE_HEADERS, **call.headers(), **answer.headers}
        return CallStream(
            call, lambda outlet: sse_events(call, answer, outlet), closing=answer.error, headers=headers
        )
    return await respond_whole(call, request, lambda: whole(call, answer))


async def prepare(api: ProviderApi[B], request: Request) -> tuple[PreparedCall, CallRequest[B]]:
    """Authenticate, parse, build the prompt and the sampling settings: a call ready for the gate."""
    state: GatewayState = request.app.state.gateway
    rollout = await authorize_rollout(request, state, request.path_params.get("rollout_id"))
    raw = await read_body(request, state.config.max_body_bytes)
    memory = await state.history.get(rollout.rollout_id, rollout.attempt)
    parsed = await api.parse(state, rollout, memory, raw)
    keyed = None
    if parsed.messages is not None:
        keyed = memory.key_messages(parsed.messages, parsed.repeated)  # 400s before the rollout starts
    rollout = await open_rollout(state, rollout)
    plan = None
    if keyed is not None:
        plan = await plan_prompt(state, keyed, memory, parsed.tools, parsed.template_kwargs, parsed.param)
        state.metrics.child(state.metrics.reuse, plan.result).inc()
        prompt_ids = plan.prompt_ids
    else:
        assert parsed.prompt_ids is not None, "a request is a conversation or a prompt"
        prompt_ids = parsed.prompt_ids
    try:
        params = sampling_params(
            state, parsed.body, len(prompt_ids), parsed.requested_max, rollout, prompt_param=parsed.param
        )
    except ContextLengthExceeded as exc:
        raise api.too_long(state, exc, parsed, len(prompt_ids), rollout) from None
    call = PreparedCall(
        state,
        rollout,
        memory,
        api.name,
        parsed.data,
        prompt_ids,
        params,
        parsed.body.stop_strings(),
        message_keys=keyed.keys if keyed is not None else None,
        history=keyed.history if keyed is not None and parsed.messages_are_the_body else None,
        prompt_source=plan.result if plan is not None else None,
        reused_prompt_tokens=plan.reused_tokens if plan is not None else 0,
    )
    return call, parsed


async def plan_prompt(
    state: GatewayState,
    keyed: KeyedMessages,
    memory: RolloutMemory,
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any] | None,
    param: str = "messages",
) -> PromptPlan:
    """The prompt of a keyed conversation (``conversation.build_prompt``, sampled-token reuse):
    a trusted incremental splice on the event loop (``quick_prompt``), anything that renders the
    whole conversation in a thread (it takes milliseconds on a long one)."""
    tokenizer = state.engine.tokenizer
    priors = list(memory.priors.values())
    history = state.config.history
    trust = state.history.trust
    tools = tokenizer.template_tools(tools)  # prepared once for every render of this call
    kwargs = template_kwargs
    plan = quick_prompt(
        tokenizer,
        keyed.messages,
        priors,
        keyed.keys,
        tools=tools,
        template_kwargs=kwargs,
        history=history,
        trust=trust,
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
            template_kwargs=kwargs,
            keys=keyed.keys,
            history=history,
            trust=trust,
        ),
        param,
    )


async def whole(call: PreparedCall, answer: Answer) -> Response:
    """Non-streaming: wait at the gate, generate, and make the call durable before anyone answers.

    The engine is told it need not stream unless stop strings are set (they are found in the text
    as it grows and end the generation early) or the answer is built from pieces. The reply is
    built before the record, so a call whose answer cannot be built (a 500) is not recorded either.
    Driven by ``delivery.respond_whole``: a client that leaves (or a rollout that ends) cancels it.
    """
    async for _ in call.admit():
        pass
    if answer.whole_from_pieces:
        gen = call.start()
        batches = gen.batches()
        try:
            async for pieces in batches:
                answer.feed_all(pieces)
        finally:
            await close_stream(batches)
    else:
        gen = await call.start(stream=bool(call.stop)).run()
    reply, response, finish = answer.whole(gen)
    await call.record(response, finish)
    return reply
