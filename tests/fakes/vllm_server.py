"""A small, real HTTP fake of vLLM's OpenAI server for tests (no GPU on dev/CI machines).

Serves the token-ID shapes ``harnessrl.engines.vllm`` relies on, as vLLM 0.32 sends them (its answers
have the fields a real server's have, so a client parses as much: ``tests/vllm/test_fake_fidelity.py``
compares them): ``GET /v1/models`` (``data[].id``, ``max_model_len``), ``GET /health``,
``POST /v1/completions`` with ``prompt`` as token IDs, ``return_token_ids`` (``token_ids``, and
``prompt_token_ids`` echoed), ``return_tokens_as_token_ids`` (``logprobs.tokens`` as
``"token_id:{id}"``), ``logprobs`` (vLLM's block: ``text_offset``, ``token_logprobs``, ``tokens`` and
``top_logprobs``, which with ``logprobs: 0`` holds each sampled token), ``stop_token_ids``,
streaming (``data: {...}`` chunks with ``logprobs.token_logprobs``, one per token or, with vLLM's
per-request ``stream_interval``, the first token then that many per chunk; then ``data: [DONE]``) or
not; and the RL dev endpoints ``/pause``, ``/resume``, ``/is_paused``,
``/collective_rpc``, which record their calls, and ``GET /server_info`` (the ``logprobs_mode``
knob; ``None`` answers 404 as a server without ``VLLM_SERVER_DEV_MODE`` does).

The "model" is deterministic: it answers ``reply`` (a list of token IDs), *continuing* it when the
prompt already ends with a prefix of it — as a real model would continue its own partial answer —
and the logprob of reply token ``j`` is ``-(j + 1) / 100``; ``texts`` gives each reply token its text
(the ``text`` fields and logprob tokens; empty by default), ``record=False`` keeps no request (a
long benchmark). With ``chat`` (``tests/fakes/vllm_chat.py``) the same reply is also served as
vLLM's chat-level APIs. Test-only knobs (plain attributes, not
HTTP): ``token_delay_s``, ``fail_with`` (statuses to answer the next completions with, e.g. 429,
503), ``kill_after_tokens`` (the server dies after streaming that many tokens of one request),
``pause_delay_s`` (``/pause`` takes that long), ``abort_after_tokens`` (the next request ends after that many tokens with ``finish_reason: "abort"``,
as vLLM's ``/pause?mode=abort`` ends in-flight requests).
:class:`FakeServer` runs any such app with uvicorn in a thread on 127.0.0.1 and can ``kill`` it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from tests.fakes.vllm_chat import ChatTurn, PromptIds, chat_routes, made_up_prompt_ids


def continue_reply(prompt: Sequence[int], reply: Sequence[int]) -> int:
    """How much of ``reply`` the prompt already ends with (the fake model continues from there)."""
    for k in range(min(len(reply) - 1, len(prompt)), 0, -1):
        # the first token alone rules out most k (a benchmark's long prompts pass through here)
        if prompt[-k] == reply[0] and list(prompt[-k:]) == list(reply[:k]):
            return k
    return 0


class FakeModel:
    """State shared by the vLLM and SGLang fakes: the reply, failure knobs, recorded calls."""

    def __init__(
        self,
        reply: Sequence[int],
        *,
        model: str = "fake-model",
        context_length: int = 4096,
        texts: Sequence[str] | None = None,
        record: bool = True,
    ):
        self.reply = list(reply)
        self.texts = dict(zip(self.reply, texts, strict=True)) if texts is not None else {}
        self.record = record
        self.model = model
        self.context_length = context_length
        self.token_delay_s = 0.0
        self.stream_intervals: list[int] = []  # each streamed request's stream_interval (1: none asked)
        self.fail_with: list[int] = []
        self.kill_after_tokens: int | None = None
        self.abort_after_tokens: int | None = None
        self.pause_delay_s = 0.0  # /pause answers after this long (vLLM's mode=wait while requests run)
        self.logprobs_mode: str | None = "processed_logprobs"
        self.requests: list[dict[str, Any]] = []  # every generation request's body but its prompt
        self.paused = False
        self.calls: list[tuple[str, Any]] = []  # (path, body) of every control/weight call
        self.prompts: list[list[int]] = []  # prompt of every generation request
        # Runtime LoRA (--enable-lora, VLLM_ALLOW_RUNTIME_LORA_UPDATING): False answers its routes 404
        # as vLLM does without them. Loaded adapters by name (requests may name one as their model).
        self.lora = True
        self.adapters: dict[str, str] = {}
        self.refuse_adapter_loads = False  # True: a load answers 500 (a folder the server cannot read)
        self.killed = threading.Event()

    def plan(
        self, prompt: Sequence[int], max_tokens: int, stop_ids: Sequence[int]
    ) -> list[tuple[int, float]]:
        start = continue_reply(prompt, self.reply)
        out: list[tuple[int, float]] = []
        for j in range(start, len(self.reply)):
            if len(out) >= max_tokens:
                break
            out.append((self.reply[j], -(j + 1) / 100))
            if self.reply[j] in stop_ids:
                break
        return out

    def failure(self) -> Response | None:
        if self.fail_with:
            status = self.fail_with.pop(0)
            return JSONResponse({"error": {"message": f"fake failure {status}", "code": status}}, status)
        return None

    async def paced(self, plan: list[tuple[int, float]]) -> AsyncIterator[tuple[int, float]]:
        for n, item in enumerate(plan):
            if self.kill_after_tokens is not None and n >= self.kill_after_tokens:
                self.killed.set()  # the FakeServer thread notices and stops the process's server
                raise ConnectionResetError("fake replica killed mid-stream")
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            yield item


#: Rendered choices a fake keeps (``create_vllm_app``).
RENDERED_KEPT = 4096


def create_vllm_app(
    fake: FakeModel, chat: ChatTurn | None = None, prompt_ids: PromptIds = made_up_prompt_ids
) -> Starlette:
    """vLLM's server over ``fake``; with ``chat``, its chat completions, Messages and Responses APIs
    too (the reply as that assistant turn; a chat answer's prompt IDs are ``prompt_ids``'s)."""

    async def models(request: Request) -> Response:
        card = {"id": fake.model, "object": "model", "owned_by": "vllm", "max_model_len": fake.context_length}
        return JSONResponse({"object": "list", "data": [card]})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    # Each answer's choices as JSON, by what they are made of: a benchmark asks for the same answer
    # thousands of times, and building vLLM's logprobs block in Python each time (~0.2 ms) would make
    # the fake, not the client of it, the costly side.
    rendered: dict[tuple[Any, ...], tuple[str, int]] = {}

    async def completions(request: Request) -> Response:
        failure = fake.failure()
        if failure is not None:
            return failure
        body = await request.json()
        prompt = body["prompt"]
        if not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
            return JSONResponse(
                {"error": {"message": "this fake only takes token-ID prompts", "code": 400}}, 400
            )
        if len(prompt) + body.get("max_tokens", 16) > fake.context_length:
            return JSONResponse({"error": {"message": "maximum context length exceeded", "code": 400}}, 400)
        if body.get("model", fake.model) not in (fake.model, *fake.adapters):
            message = f"The model `{body['model']}` does not exist."
            return JSONResponse({"error": {"message": message, "code": 404}}, 404)
        if fake.record:
            fake.prompts.append(prompt)
            fake.requests.append({k: v for k, v in body.items() if k != "prompt"})
        plan = fake.plan(prompt, body.get("max_tokens", 16), body.get("stop_token_ids") or [])
        with_ids = bool(body.get("return_token_ids"))
        # vLLM names each logprobs token "token_id:{id}" when asked, else by its text (``texts``).
        as_ids = bool(body.get("return_tokens_as_token_ids"))

        offset = 0  # vLLM's text_offset counts the logprobs tokens' characters over the whole answer

        def choice(
            items: list[tuple[int, float]], finish: str | None, start: int
        ) -> tuple[dict[str, Any], int]:
            """One choice of ``items``, its text offsets counted from ``start``; and where they end."""
            text = "".join(fake.texts.get(t, "") for t, _ in items)
            out: dict[str, Any] = {"index": 0, "text": text}
            end = start
            if body.get("logprobs") is not None:
                # vLLM 0.32's block: with ``logprobs: 0`` each token's top_logprobs holds the sampled one.
                names = [f"token_id:{t}" if as_ids else fake.texts.get(t, "") for t, _ in items]
                offsets = list(itertools.accumulate((len(n) for n in names), initial=start))
                end = offsets.pop()
                out["logprobs"] = {
                    "text_offset": offsets,
                    "token_logprobs": [lp for _, lp in items],
                    "tokens": names,
                    "top_logprobs": [{n: lp} for n, (_, lp) in zip(names, items, strict=True)],
                }
            out |= {"finish_reason": finish, "stop_reason": None, "prompt_token_ids": None}
            out["token_ids"] = [t for t, _ in items] if with_ids else None
            return out, end

        offset = 0  # vLLM's text_offset counts the logprobs tokens' characters over the whole answer

        def choice_json(items: list[tuple[int, float]], finish: str | None, *, whole: bool) -> str:
            """``choice``'s JSON at the answer's offset (a whole answer's with the fields only it has),
            kept by what it is made of unless it echoes the prompt."""
            nonlocal offset
            key = (tuple(items), finish, offset, whole, as_ids, body.get("logprobs") is not None)
            found = None if with_ids else rendered.get(key)
            if found is None:
                out, end = choice(items, finish, offset)
                if whole:
                    out["prompt_logprobs"] = None
                    if with_ids:
                        out["prompt_token_ids"] = prompt  # in the choice, as vLLM echoes it
                found = json.dumps(out, separators=(",", ":")), end
                if not with_ids:
                    if len(rendered) >= RENDERED_KEPT:
                        rendered.clear()
                    rendered[key] = found
            text, offset = found
            return text

        def with_choice(payload: dict[str, Any], choice_text: str) -> str:
            return json.dumps({**payload, "choices": ["@CHOICE@"]}).replace('"@CHOICE@"', choice_text, 1)

        finish = "stop" if plan and plan[-1][0] in (body.get("stop_token_ids") or []) else "length"
        if fake.abort_after_tokens is not None:
            plan, finish = plan[: fake.abort_after_tokens], "abort"
            fake.abort_after_tokens = None
        base = {
            "id": "cmpl-fake",
            "object": "text_completion",
            "created": int(time.time()),
            "model": fake.model,
        }
        if not body.get("stream"):
            items = [item async for item in fake.paced(plan)]
            usage = {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + len(items)}
            usage |= {"completion_tokens": len(items), "prompt_tokens_details": None}
            payload = {**base, "service_tier": None, "system_fingerprint": "fake", "usage": usage}
            text = with_choice(payload | {"kv_transfer_params": None}, choice_json(items, finish, whole=True))
            return Response(text, media_type="application/json")

        # vLLM's per-request stream_interval: the first token at once, then every that many; the
        # last ones as soon as the answer ends.
        interval = body.get("stream_interval") or 1
        if fake.record:
            fake.stream_intervals.append(interval)

        async def chunks() -> AsyncIterator[str]:
            group: list[tuple[int, float]] = []
            sent = 0
            async for item in fake.paced(plan):
                group.append(item)
                if sent == 0 or len(group) >= interval:
                    yield f"data: {with_choice(base, choice_json(group, None, whole=False))}\n\n"
                    sent += len(group)
                    group = []
            if group:
                yield f"data: {with_choice(base, choice_json(group, None, whole=False))}\n\n"
            yield f"data: {with_choice(base, choice_json([], finish, whole=False))}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    def recorder(path: str) -> Any:
        async def record(request: Request) -> Response:
            raw = await request.body()
            fake.calls.append((path, json.loads(raw) if raw else dict(request.query_params)))
            if path == "/pause":
                await asyncio.sleep(fake.pause_delay_s)
                fake.paused = True
            elif path == "/resume":
                fake.paused = False
            return JSONResponse({"status": "ok"})

        return record

    async def lora_adapter(request: Request) -> Response:
        if not fake.lora:
            return JSONResponse({"detail": "Not Found"}, 404)
        body = await request.json()
        fake.calls.append((request.url.path, body))
        name = body["lora_name"]
        if request.url.path == "/v1/load_lora_adapter":
            if fake.refuse_adapter_loads:
                return JSONResponse({"error": {"message": "cannot read the adapter", "code": 500}}, 500)
            if name in fake.adapters and not body.get("load_inplace"):
                message = f"The lora adapter '{name}' has already been loaded."
                return JSONResponse({"error": {"message": message, "code": 400}}, 400)
            fake.adapters[name] = body["lora_path"]
            return Response(f"Success: LoRA adapter '{name}' added successfully.")
        if fake.adapters.pop(name, None) is None:
            message = f"The lora adapter '{name}' cannot be found."
            return JSONResponse({"error": {"message": message, "code": 404}}, 404)
        return Response(f"Success: LoRA adapter '{name}' removed successfully.")

    async def is_paused(request: Request) -> Response:
        return JSONResponse({"is_paused": fake.paused})

    async def server_info(request: Request) -> Response:
        if fake.logprobs_mode is None:
            return JSONResponse({"detail": "Not Found"}, 404)
        return JSONResponse({"vllm_config": {"model_config": {"logprobs_mode": fake.logprobs_mode}}})

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/is_paused", is_paused, methods=["GET"]),
        Route("/server_info", server_info, methods=["GET"]),
        *[Route(p, recorder(p), methods=["POST"]) for p in ("/pause", "/resume", "/collective_rpc")],
        *[
            Route(p, lora_adapter, methods=["POST"])
            for p in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
        ],
    ]
    if chat is not None:
        routes += chat_routes(fake, chat, prompt_ids)
    return Starlette(routes=routes)


class FakeServer:
    """Runs an app with uvicorn on 127.0.0.1 in a thread. ``kill()`` stops it; the port then refuses."""

    def __init__(self, app: Starlette, fake: FakeModel):
        self.fake = fake
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="critical", access_log=False, timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._watch = threading.Thread(target=self._watch_kill, daemon=True)

    def start(self) -> FakeServer:
        if self._thread.is_alive():
            return self
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)
        self._watch.start()
        return self

    def _watch_kill(self) -> None:
        self.fake.killed.wait()
        self.kill()

    def kill(self) -> None:
        self.fake.killed.set()
        self._server.should_exit = True
        self._server.force_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()


def serve_vllm(reply: Sequence[int], **kwargs: Any) -> FakeServer:
    """A started fake vLLM server answering ``reply``; use as a context manager or call ``kill()``."""
    fake = FakeModel(reply, **kwargs)
    return FakeServer(create_vllm_app(fake), fake).start()
