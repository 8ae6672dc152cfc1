"""A small, real HTTP fake of SGLang's native server for tests (no GPU on dev/CI machines).

Serves the shapes ``harnessrl.engines.sglang`` relies on, as SGLang documents them: ``POST /generate``
with ``input_ids``, ``sampling_params`` (``max_new_tokens``, ``stop_token_ids``), ``return_logprob``
and ``stream`` (events ``data: {"text", "output_ids", "meta_info": {"output_token_logprobs":
[[logprob, id, null], ...], "finish_reason"}}``, cumulative by default as SGLang streams them, or
incremental; then ``data: [DONE]``); ``GET /get_model_info``, ``GET /get_server_info``,
``GET /health``; ``POST /update_weights_from_disk``, ``/pause_generation``, ``/continue_generation``,
``/load_lora_adapter``, ``/unload_lora_adapter`` (recorded; ``fail_update`` fails the loads). The deterministic model, failure knobs and server runner are the vLLM fake's.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from tests.fakes.vllm_server import FakeModel, FakeServer


def create_sglang_app(fake: FakeModel, *, incremental: bool = False, fail_update: bool = False) -> Starlette:
    async def model_info(request: Request) -> Response:
        return JSONResponse({"model_path": fake.model, "tokenizer_path": fake.model, "is_generation": True})

    async def server_info(request: Request) -> Response:
        return JSONResponse({"context_length": fake.context_length, "version": "fake"})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def generate(request: Request) -> Response:
        failure = fake.failure()
        if failure is not None:
            return failure
        body = await request.json()
        prompt = body["input_ids"]
        sampling = body.get("sampling_params") or {}
        fake.prompts.append(prompt)
        fake.requests.append({k: v for k, v in body.items() if k != "input_ids"})
        stops = sampling.get("stop_token_ids") or []
        plan = fake.plan(prompt, sampling.get("max_new_tokens", 128), stops)
        finish = {"type": "stop"} if plan and plan[-1][0] in stops else {"type": "length"}

        def event(items: list[tuple[int, float]], done: bool) -> dict[str, Any]:
            meta: dict[str, Any] = {"prompt_tokens": len(prompt), "completion_tokens": len(items)}
            if body.get("return_logprob"):
                meta["output_token_logprobs"] = [[lp, t, None] for t, lp in items]
            meta["finish_reason"] = finish if done else None
            return {"text": "", "output_ids": [t for t, _ in items], "meta_info": meta}

        if not body.get("stream"):
            items = [item async for item in fake.paced(plan)]
            return JSONResponse(event(items, True))

        async def events() -> AsyncIterator[str]:
            sent: list[tuple[int, float]] = []
            async for item in fake.paced(plan):
                sent.append(item)
                yield f"data: {json.dumps(event([item] if incremental else sent, False))}\n\n"
            yield f"data: {json.dumps(event([] if incremental else sent, True))}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    def recorder(path: str) -> Any:
        async def record(request: Request) -> Response:
            raw = await request.body()
            fake.calls.append((path, json.loads(raw) if raw else {}))
            if path in ("/load_lora_adapter", "/unload_lora_adapter"):
                return JSONResponse({"success": not fail_update, "message": "fake: adapter " + path})
            if path == "/update_weights_from_disk":
                if fail_update:
                    return JSONResponse({"success": False, "message": "fake: cannot load"})
                return JSONResponse({"success": True, "message": "Succeeded to update model weights."})
            return JSONResponse({})

        return record

    control = (
        "/update_weights_from_disk",
        "/pause_generation",
        "/continue_generation",
        "/load_lora_adapter",
        "/unload_lora_adapter",
    )
    routes = [
        Route("/get_model_info", model_info, methods=["GET"]),
        Route("/get_server_info", server_info, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/generate", generate, methods=["POST"]),
        *[Route(p, recorder(p), methods=["POST"]) for p in control],
    ]
    return Starlette(routes=routes)


def serve_sglang(
    reply: Sequence[int], *, incremental: bool = False, fail_update: bool = False, **kwargs: Any
) -> FakeServer:
    """A started fake SGLang server answering ``reply``."""
    fake = FakeModel(reply, **kwargs)
    return FakeServer(create_sglang_app(fake, incremental=incremental, fail_update=fail_update), fake).start()
