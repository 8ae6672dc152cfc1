"""``POST /v1/completions`` (legacy text completions), ``GET /v1/models`` and ``/v1/models/{id}``.

The prompt is text (encoded with the policy's tokenizer, special-token strings included) or a list
of token IDs used verbatim — the way to drive the policy token-in/token-out from outside. No chat
template and no reuse: the caller owns the exact prompt. The call runs through ``pipeline``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from harnessrl.errors import BadRequest, ContextLengthExceeded, HarnessRLError, NotFound
from harnessrl.gateway.apis.openai_shapes import openai_envelope, openai_usage
from harnessrl.gateway.auth import authorize_rollout
from harnessrl.gateway.bodies import parse_body, validate_body
from harnessrl.gateway.body_models import CompletionRequest
from harnessrl.gateway.errors import sse_error
from harnessrl.gateway.pipeline.answer import feed_each
from harnessrl.gateway.pipeline.calls import PreparedCall
from harnessrl.gateway.pipeline.driver import CallRequest, Streamed, Whole, serve
from harnessrl.gateway.pipeline.generation import Generation, Piece
from harnessrl.gateway.pipeline.limits import check_prompt_size, check_token_ids, tokenize_in_thread
from harnessrl.gateway.pipeline.wire import DONE, json_response, sse
from harnessrl.gateway.prompt.history import RolloutMemory
from harnessrl.gateway.state import GatewayState
from harnessrl.schemas import Rollout


class _LegacyLogprobs:
    """Accumulates the legacy ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` shape."""

    def __init__(self, state: GatewayState, offset: int = 0) -> None:
        self._state = state
        self._offset = offset
        self.clear()

    def clear(self) -> None:
        self.tokens: list[str] = []
        self.token_logprobs: list[float] = []
        self.text_offset: list[int] = []

    def add(self, token_ids: list[int], logprobs: list[float]) -> None:
        for token, logprob in zip(self._state.engine.tokenizer.token_texts(token_ids), logprobs, strict=True):
            self.tokens.append(token)
            self.token_logprobs.append(logprob)
            self.text_offset.append(self._offset)
            self._offset += len(token)

    def take(self) -> dict[str, Any]:
        out = {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": None,
            "text_offset": self.text_offset,
        }
        self.clear()
        return out


class CompletionsApi:
    name = "completions"

    async def parse(
        self, state: GatewayState, rollout: Rollout, memory: RolloutMemory, raw: bytes
    ) -> CallRequest[CompletionRequest]:
        data = parse_body(raw)
        body = validate_body(CompletionRequest, data)
        body.check_n()
        check_prompt_size(state, data, "prompt")
        prompt = body.single_prompt()
        if isinstance(prompt, str):
            prompt_ids = await tokenize_in_thread(
                state, lambda: state.engine.tokenizer.encode(prompt), "prompt"
            )
            if not prompt_ids:
                raise BadRequest("prompt is empty", param="prompt")
        else:
            prompt_ids = list(prompt)
            check_token_ids(state, prompt_ids)
        return CallRequest(data, body, body.max_tokens, "prompt", prompt_ids=prompt_ids)

    def too_long(
        self,
        state: GatewayState,
        exc: ContextLengthExceeded,
        request: CallRequest[Any],
        prompt_len: int,
        rollout: Rollout,
    ) -> ContextLengthExceeded:
        return exc

    def answer(self, call: PreparedCall, request: CallRequest[CompletionRequest]) -> CompletionAnswer:
        return CompletionAnswer(call, request.body)


COMPLETIONS = CompletionsApi()


async def completions(request: Request) -> Response:
    return await serve(COMPLETIONS, request)


class CompletionAnswer:
    """A ``text_completion``, whole or streamed."""

    headers: dict[str, str] = {}
    ping = None
    whole_from_pieces = False

    def __init__(self, call: PreparedCall, body: CompletionRequest) -> None:
        self.call = call
        self.body = body
        self.model = body.model or call.state.engine.model_name
        self.acc = _LegacyLogprobs(call.state) if body.logprobs is not None else None
        self.base: dict[str, Any] = {}

    def whole(self, gen: Generation) -> Whole:
        logprobs = None
        if self.acc is not None:
            stop_ids = set(self.call.params.stop_token_ids)
            kept = [(t, lp) for t, lp in zip(gen.token_ids, gen.logprobs, strict=True) if t not in stop_ids]
            self.acc.add([t for t, _ in kept], [lp for _, lp in kept])
            logprobs = self.acc.take()
        finish = gen.finish_reason
        payload = {
            **openai_envelope("cmpl", "text_completion", self.model, gen.policy_version),
            "choices": [{"index": 0, "text": gen.text, "logprobs": logprobs, "finish_reason": finish}],
            "usage": openai_usage(self.call),
        }
        return Whole(json_response(payload), {"text": gen.text}, finish)

    def opening(self) -> list[str]:
        return []

    def waiting(self, comment: str) -> list[str]:
        return [comment]

    def started(self, gen: Generation) -> list[str]:
        policy = self.call.state.engine.policy_version
        self.base = openai_envelope("cmpl", "text_completion", self.model, policy)
        return []

    def held(self) -> list[str]:
        return []  # every piece's events are sent as they are made

    def feed_all(self, pieces: list[Piece]) -> list[str]:
        return feed_each(self.feed, pieces)

    def feed(self, piece: Piece) -> list[str]:
        if self.acc is not None and piece.token_id >= 0 and not piece.is_stop_token:
            self.acc.add([piece.token_id], [piece.logprob])
        return [self._chunk(piece.text)] if piece.text else []

    def finished(self, gen: Generation) -> Streamed:
        tail = [self._chunk("", finish=gen.finish_reason)]
        if self.body.include_usage:
            tail.append(sse({**self.base, "choices": [], "usage": openai_usage(self.call)}))
        tail.append(DONE)
        return Streamed([], {"text": gen.text}, gen.finish_reason, tail)

    def error(self, exc: HarnessRLError) -> str:
        return sse_error(exc)

    def _chunk(self, text: str, finish: str | None = None) -> str:
        lp = self.acc.take() if self.acc is not None else None
        return sse(
            {**self.base, "choices": [{"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}]}
        )


async def list_models(request: Request) -> Response:
    state: GatewayState = request.app.state.gateway
    await authorize_rollout(request, state, request.path_params.get("rollout_id"))
    # Harnesses send whatever model name they were configured with; every name reaches the policy.
    model = _model_object(request, state, state.engine.model_name)
    if "anthropic-version" in request.headers:  # Anthropic's page of models
        return JSONResponse(
            {"data": [model], "has_more": False, "first_id": model["id"], "last_id": model["id"]}
        )
    return JSONResponse({"object": "list", "data": [model]})


async def retrieve_model(request: Request) -> Response:
    """``GET /v1/models/{model_id}`` (``client.models.retrieve``, which some harnesses call at start
    to check the name they were configured with): every name is served, as model calls take every
    name, so the harness's own name is answered as itself."""
    state: GatewayState = request.app.state.gateway
    await authorize_rollout(request, state, request.path_params.get("rollout_id"))
    model_id = request.path_params["model_id"]
    if not model_id:  # ``/models/``: no id to answer as
        raise NotFound("no model id in the path: GET /models/{id}")
    return JSONResponse(_model_object(request, state, model_id))


def _model_object(request: Request, state: GatewayState, model_id: str) -> dict[str, Any]:
    """A model in OpenAI's shape, or in Anthropic's for a request that carries ``anthropic-version``
    (the anthropic SDK's ``models.list`` and ``models.retrieve``)."""
    if "anthropic-version" in request.headers:
        created = datetime.fromtimestamp(int(state.started_at), UTC).isoformat().replace("+00:00", "Z")
        return {"type": "model", "id": model_id, "display_name": model_id, "created_at": created}
    return {"id": model_id, "object": "model", "created": int(state.started_at), "owned_by": "harnessrl"}
