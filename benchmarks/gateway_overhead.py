"""Gateway overhead: direct calls to a vLLM-shaped upstream vs the harnessrl gateway vs Agent Lightning's.

What is measured. One run starts a fake vLLM-shaped upstream (this file, starlette + uvicorn; instant
answers, always the same 256-token assistant turn — some text and one Hermes tool call — with token
IDs and one logprob per token; chat non-streaming, ``/v1/completions`` streaming one SSE event per
token when asked, as vLLM does) and drives it three ways with the *same* pre-serialized
agent-like request bodies (20-turn conversations that grow by one assistant tool call and one
shell-like tool result per turn, with a system prompt and tool schemas; the last body is ~40 KB):

- ``direct``: ``POST /v1/chat/completions`` on the upstream;
- ``harnessrl``: the harnessrl gateway (``create_app`` served by uvicorn like ``run_gateway``, durable
  SQLite store — the default WAL store; each call is committed before its answer is sent) in front
  of the upstream, one rollout per conversation (``POST /api/rollouts``), chat calls to the rollout's
  ``base_url``. The gateway renders the chat template, tokenizes (with sampled-token reuse), and calls
  the upstream's ``/v1/completions`` with a token-ID prompt — through ``VLLMEngine`` when
  ``harnessrl.engines.vllm`` exists and works (non-streaming clients: one JSON answer, as the
  engine asks for then), otherwise through a minimal engine adapter defined here (the JSON says
  which). Tokenizer: the ``tiny`` model's (Qwen-style byte-level BPE);
- ``agentlightning``: Agent Lightning 1.0.2's ``agl-server`` (its own Python 3.12 venv in
  ``.bench/agl-venv``), model registered with ``POST /api/models``, one rollout per conversation via
  ``POST /api/rollouts``, calls to ``/proxy/rollout/{id}/attempt/0/mode/train/openai/v1/chat/completions``.
  It forwards the chat body to the upstream's ``/v1/chat/completions`` and keeps an in-memory event.

Concurrency 1 and 32 (each client worker runs whole conversations one turn after another). The three
targets are measured in interleaved rounds (the order rotates each round) so that background load on
a shared machine hits all three alike; the load average is recorded per batch. Reported per level:
req/s (requests / batch wall time, summed over rounds), p50/p99 latency, and the ratios to direct.

CPU accounting. Each batch also records the CPU time (user + system, ``/proc/PID/stat``, 10 ms ticks
summed over the batch) of every process a call passes through — ``upstream``, ``gateway`` (the
harnessrl gateway or ``agl-server``) and the load-generating ``client`` (``time.process_time``) —
reported per level and target as ``cpu_ms_per_call``. ``cpu_ceilings`` turns that into the
throughput the machine's cores allow (``cores * 1000 / total CPU ms per call``: client, upstream
and proxy share the cores), what each server process allows on its one core (``1000 / its CPU ms``:
a Python server's Python code runs on one core at a time) and which of these binds, and the gateway
CPU per call at which harnessrl's ceiling would be 0.8x direct's; ``goals.cpu_c32`` says it in one
line. Where the measured req/s is near its ceiling, the
run was CPU-bound and only less CPU per call (not less waiting) can raise it.

What it does not show. The upstream is instant, so this is the proxy's own cost, not what a run
would see end to end (a real engine takes far longer per call, which hides most of it). The load
generator, upstream and proxies share the same CPU cores, so at C=32 the throughput ratio partly
measures who uses the least CPU. ``agl-server`` runs as installed (uvicorn without uvloop/httptools,
access log on — its defaults) and records in memory (nothing durable); harnessrl does more work per
call (tokenization, tool-call parsing, durable write). No streaming.

Run (one command; re-executes itself inside a loopback-only network namespace when it can)::

    .venv/bin/python benchmarks/gateway_overhead.py            # ~2-4 min on 2 shared CPU cores
    .venv/bin/python benchmarks/gateway_overhead.py --quick    # fewer rounds, seconds
    .venv/bin/python benchmarks/gateway_overhead.py --no-agl   # without Agent Lightning

The AGL venv (Python 3.12, ``agentlightning==1.0.2``) is made by ``./install.sh --bench`` in
``.bench/agl-venv`` (``--agl-venv`` to point elsewhere; without it the run skips Agent Lightning and
says so in the JSON). Writes ``benchmarks/results/gateway_overhead.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import random
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results" / "gateway_overhead.json"
DEFAULT_AGL_VENV = ROOT / ".bench" / "agl-venv"
OUTPUT_TOKENS = 256
TURNS = 20
MODEL = "bench-model"
NETNS_ENV = "HARNESSRL_BENCH_NETNS"
# Nothing in this benchmark should reach outside 127.0.0.1; belt and braces for the peer's libraries.
OFFLINE_ENV = {
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "LITELLM_TELEMETRY": "False",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "AGENTOPS_API_KEY": "",
    "OTEL_SDK_DISABLED": "true",
    "NO_PROXY": "*",
    "no_proxy": "*",
}


# --- the fixed assistant turn and the conversations ---------------------------------------------------


def _tokenizer() -> Any:
    from harnessrl.engines.tiny import tiny_model_dir
    from harnessrl.tokenizer import PolicyTokenizer

    return PolicyTokenizer.from_dir(tiny_model_dir(weights=False))


_REPLY_TEXT = (
    "The failing test points at the parser: the tokenizer splits the header before the colon, so the "
    "value keeps a leading space and the comparison in check_headers fails. I will look at how "
    "parse_line handles continuation lines, then run the narrower test again to confirm the fix "
    "before touching anything else in the module. "
)


def build_reply(tokenizer: Any) -> dict[str, Any]:
    """The upstream's answer: text + one bash tool call in Hermes format, exactly 256 tokens with <|im_end|>."""
    from harnessrl.engines.scripted import render_turn

    words = _REPLY_TEXT.split()
    args = {"command": "cd /workspace/repo && python -m pytest tests/test_parser.py -x -q 2>&1 | tail -n 40"}
    for filler in (" ok", " x", " then", "."):
        content_words: list[str] = []
        ids: list[int] = []
        i = 0
        while len(ids) < OUTPUT_TOKENS:
            content_words.append(words[i % len(words)])
            i += 1
            turn = {"content": " ".join(content_words), "tool_calls": [{"name": "bash", "arguments": args}]}
            ids = tokenizer.encode(render_turn(turn))
        for extra in range(40):
            content = " ".join(content_words[:-1]) + filler * extra
            turn = {"content": content, "tool_calls": [{"name": "bash", "arguments": args}]}
            ids = tokenizer.encode(render_turn(turn))
            if len(ids) == OUTPUT_TOKENS:
                tokens = [tokenizer.decode([t]) for t in ids]
                return {
                    "content": content,
                    "arguments": json.dumps(args),
                    "text": render_turn(turn),
                    "token_ids": ids,
                    "tokens": tokens,
                    "logprobs": [-round(0.001 + (t * 7919 % 1000) / 997.0, 6) for t in ids],
                }
            if len(ids) > OUTPUT_TOKENS:
                break
    raise RuntimeError("could not build a 256-token reply")


_SYSTEM = (
    "You are a software engineering agent working in a sandboxed Linux container. You solve the task by "
    "running shell commands with the bash tool and editing files with the edit tool. Think before each "
    "step, keep changes minimal, run the relevant tests after each change, and finish with a short "
    "summary of what you changed and why. Never ask the user questions; decide yourself. "
) * 3
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command in the repository and return stdout and stderr.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command to run."}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit",
            "description": "Replace an exact string in a file.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "old": {"type": "string"},
                    "new": {"type": "string"},
                },
                "required": ["path", "old", "new"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "finish",
            "description": "Finish the task with a summary.",
            "parameters": {"type": "object", "properties": {"summary": {"type": "string"}}},
        },
    },
]


def _tool_output(rng: random.Random, turn: int) -> str:
    kind = turn % 4
    if kind == 0:
        lines = [f"drwxr-xr-x  {rng.randint(2, 9)} root root  4096 Nov 29 10:{rng.randint(10, 59)} ."]
        for _ in range(rng.randint(12, 30)):
            name = rng.choice(["parser", "headers", "utils", "cli", "io", "test_parser", "conftest", "setup"])
            lines.append(
                f"-rw-r--r--  1 root root {rng.randint(80, 90000):6d} Nov 28 {rng.randint(10, 23)}:"
                f"{rng.randint(10, 59)} {name}_{rng.randint(0, 99)}.py"
            )
        return "\n".join(lines)
    if kind == 1:
        n = rng.randint(3, 9)
        body = [
            f"tests/test_parser.py::test_case_{i} {'PASSED' if rng.random() < 0.7 else 'FAILED'}"
            for i in range(n)
        ]
        tb = [
            "=================================== FAILURES ===================================",
            f"____________________________ test_case_{rng.randint(0, n)} ____________________________",
            "    def test_header_value():",
            '        msg = parse_line("Content-Type:  text/plain")',
            '>       assert msg.value == "text/plain"',
            "E       AssertionError: assert ' text/plain' == 'text/plain'",
            "E         - text/plain",
            "E         + ' text/plain'",
            "",
            f"tests/test_parser.py:{rng.randint(10, 400)}: AssertionError",
            f"========================= {n // 3 + 1} failed, {n} passed in {rng.random():.2f}s =========",
        ]
        return "\n".join(body + tb)
    if kind == 2:
        return "\n".join(
            f"src/pkg/{rng.choice(['parser', 'headers', 'utils'])}.py:{rng.randint(1, 900)}:    "
            f"value = line.split(':', 1)[1]{'.strip()' if rng.random() < 0.5 else ''}  # {rng.random():.6f}"
            for _ in range(rng.randint(6, 20))
        )
    source = [
        "def parse_line(line: str) -> Header:",
        '    """Parse one header line; continuation lines start with whitespace."""',
        "    if line[:1] in (' ', '\\t'):",
        "        return Header(name=None, value=line.strip(), continuation=True)",
        "    name, _, value = line.partition(':')",
        "    return Header(name=name.strip().lower(), value=value, continuation=False)",
    ]
    return "\n".join(f"{i + rng.randint(1, 300):5d}\t{s}" for i, s in enumerate(source * rng.randint(2, 5)))


def build_conversations(reply: dict[str, Any], count: int, seed: int = 0) -> list[list[bytes]]:
    """``count`` conversations, each a list of ``TURNS`` serialized request bodies (call k sees k turns)."""
    conversations = []
    for c in range(count):
        rng = random.Random(seed * 1000 + c)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": _SYSTEM},
            {
                "role": "user",
                "content": f"Issue #{100 + c}: header values keep a leading space after the "
                "colon. Make tests/test_parser.py pass without breaking other tests.",
            },
        ]
        bodies = []
        for turn in range(TURNS):
            body = {
                "model": MODEL,
                "messages": messages,
                "tools": _TOOLS,
                "max_tokens": 1024,
                "temperature": 1.0,
                # What AGL's train mode adds before forwarding; sent to every target so each upstream
                # call does the same work (vLLM: token IDs of prompt and answer, sampled logprobs).
                "logprobs": True,
                "return_token_ids": True,
            }
            bodies.append(json.dumps(body).encode())
            call_id = f"call_{c}_{turn}"
            messages = [
                *messages,
                {
                    "role": "assistant",
                    "content": reply["content"],
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": "bash", "arguments": reply["arguments"]},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": call_id, "content": _tool_output(rng, turn)},
            ]
        conversations.append(bodies)
    return conversations


# --- the fake vLLM-shaped upstream ----------------------------------------------------------------------


def serve_upstream(port: int) -> None:
    """Instant answers. ``/v1/chat/completions`` (vLLM shape with ``return_token_ids``: ``prompt_token_ids``
    at top level — fabricated, one per 4 body bytes, the fake has no chat template — and ``token_ids``
    per choice) and ``/v1/completions`` with a token-ID prompt (echoed as ``prompt_token_ids``)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    reply = build_reply(_tokenizer())
    ids, tokens, lps = reply["token_ids"], reply["tokens"], reply["logprobs"]
    usage_out = len(ids)
    chat_logprobs = {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
            for t, lp in zip(tokens, lps, strict=True)
        ]
    }
    offsets, pos = [], 0
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    comp_logprobs = {"tokens": tokens, "token_logprobs": lps, "text_offset": offsets, "top_logprobs": None}
    message = {
        "role": "assistant",
        "content": reply["content"],
        "reasoning_content": None,
        "tool_calls": [
            {"id": "", "type": "function", "function": {"name": "bash", "arguments": reply["arguments"]}}
        ],
    }
    seven = "7," * 200_000
    counter = iter(range(10**12))

    def chat_json(body: dict[str, Any], n_prompt: int) -> str:
        n = next(counter)
        msg = {**message, "tool_calls": [{**message["tool_calls"][0], "id": f"chatcmpl-tool-{n}"}]}
        out: dict[str, Any] = {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", MODEL),
            "choices": [
                {
                    "index": 0,
                    "message": msg,
                    "logprobs": chat_logprobs if body.get("logprobs") else None,
                    "finish_reason": "tool_calls",
                    "stop_reason": None,
                    "token_ids": ids if body.get("return_token_ids") else None,
                }
            ],
            "usage": {
                "prompt_tokens": n_prompt,
                "completion_tokens": usage_out,
                "total_tokens": n_prompt + usage_out,
            },
            "prompt_token_ids": "@PROMPT@" if body.get("return_token_ids") else None,
        }
        text = json.dumps(out)
        return text.replace('"@PROMPT@"', "[" + seven[: 2 * n_prompt - 1] + "]") if n_prompt else text

    async def chat(request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw)
        return Response(chat_json(body, max(1, len(raw) // 4)), media_type="application/json")

    # Streaming (what VLLMEngine asks for when its client streams): one SSE event per token, as vLLM
    # sends by default; the first carries ``prompt_token_ids``. Pre-serialized, sent as one body.
    stream_events = []
    for k, (tok_id, tok, lp) in enumerate(zip(ids, tokens, lps, strict=True)):
        last = k == len(ids) - 1
        choice = {
            "index": 0,
            "text": tok,
            "logprobs": {
                "tokens": [tok],
                "token_logprobs": [lp],
                "text_offset": [offsets[k]],
                "top_logprobs": None,
            },
            "finish_reason": "stop" if last else None,
            "stop_reason": None,
            "token_ids": [tok_id],
        }
        if k == 0:
            choice["prompt_token_ids"] = "@PROMPT@"
        event = {
            "id": "cmpl-bench",
            "object": "text_completion",
            "created": 0,
            "model": MODEL,
            "choices": [choice],
        }
        stream_events.append(f"data: {json.dumps(event)}\n\n")
    stream_head, stream_tail = "".join(stream_events).split('"@PROMPT@"')
    stream_tail = (stream_tail + "data: [DONE]\n\n").encode()
    stream_head_b = stream_head.encode()

    async def completions(request: Request) -> Response:
        body = json.loads(await request.body())
        prompt = body["prompt"]
        if body.get("stream"):
            content = stream_head_b + json.dumps(prompt).encode() + stream_tail
            return Response(content, media_type="text/event-stream")
        n = next(counter)
        want = body.get("return_token_ids")
        out = {
            "id": f"cmpl-{n}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model", MODEL),
            "choices": [
                {
                    "index": 0,
                    "text": reply["text"],
                    "logprobs": comp_logprobs if body.get("logprobs") is not None else None,
                    "finish_reason": "stop",
                    "stop_reason": None,
                    "prompt_token_ids": prompt if want else None,
                    "token_ids": ids if want else None,
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": usage_out,
                "total_tokens": len(prompt) + usage_out,
            },
        }
        return Response(json.dumps(out), media_type="application/json")

    async def models(request: Request) -> Response:
        return JSONResponse(
            {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 32768}]}
        )

    async def health(request: Request) -> Response:
        return Response(b"")

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models),
            Route("/health", health),
        ]
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# --- the harnessrl gateway and its engine ----------------------------------------------------------------


class UpstreamCompletionsEngine:
    """Minimal harnessrl Engine over a vLLM-shaped ``/v1/completions`` with a token-ID prompt (not streaming).

    Used when ``harnessrl.engines.vllm.VLLMEngine`` is not available; it sends what a vLLM engine sends
    (``prompt`` as token IDs, ``return_token_ids``, ``logprobs``) and yields the returned tokens.
    """

    def __init__(self, base_url: str, tokenizer: Any, context_length: int = 32768) -> None:
        self._base_url = base_url.rstrip("/")
        self._tokenizer = tokenizer
        self._context_length = context_length
        self._version = 0
        self._client: Any = None

    @property
    def model_name(self) -> str:
        return MODEL

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def context_length(self) -> int:
        return self._context_length

    @property
    def policy_version(self) -> int:
        return self._version

    async def start(self) -> None:
        import httpx

        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(300.0),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=256),
        )

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def generate(
        self, prompt_ids: Sequence[int], params: Any, context: Any = None
    ) -> AsyncIterator[Any]:
        from harnessrl.engines.base import TokenSample
        from harnessrl.errors import UpstreamError

        body = {
            "model": MODEL,
            "prompt": list(prompt_ids),
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": 0,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "stop_token_ids": list(params.stop_token_ids),
        }
        if params.seed is not None:
            body["seed"] = params.seed
        try:
            response = await self._client.post(f"{self._base_url}/completions", json=body)
        except Exception as exc:  # noqa: BLE001 - any transport failure is the upstream's
            raise UpstreamError(f"upstream unreachable: {exc}") from exc
        if response.status_code != 200:
            raise UpstreamError(f"upstream answered {response.status_code}: {response.text[:200]}")
        choice = response.json()["choices"][0]
        for token_id, logprob in zip(choice["token_ids"], choice["logprobs"]["token_logprobs"], strict=True):
            yield TokenSample(int(token_id), float(logprob))

    async def update_weights(self, update: Any) -> None:
        self._version = update.version

    async def health(self) -> dict[str, Any]:
        return {"engine": "benchmark-upstream-adapter", "url": self._base_url}


def make_engine(upstream: str, tokenizer: Any, kind: str) -> tuple[Any, str]:
    """``VLLMEngine`` against the fake upstream (``kind`` auto/vllm) when it exists, else the adapter above."""
    if kind in ("auto", "vllm"):
        try:
            from harnessrl.engines.vllm import VLLMEngine
        except ImportError as exc:
            if kind == "vllm":
                raise
            reason = f"no VLLMEngine: {exc}"
        else:
            engine = VLLMEngine(upstream, tokenizer, model=MODEL)
            return engine, (
                "harnessrl.engines.vllm.VLLMEngine (/v1/completions with a token-ID prompt; one JSON answer "
                "for non-streaming clients, SSE per token for streaming ones)"
            )
    else:
        reason = "asked for"
    adapter = UpstreamCompletionsEngine(f"{upstream}/v1", tokenizer)
    return adapter, f"benchmark adapter, non-streaming /v1/completions with token-ID prompt ({reason})"


def serve_harnessrl(
    port: int, upstream: str, store_path: str, admin_key: str, engine_file: str, kind: str
) -> None:
    import uvicorn

    from harnessrl.config import GatewayConfig
    from harnessrl.gateway.app import create_app
    from harnessrl.store import open_store

    engine, description = make_engine(upstream, _tokenizer(), kind)
    Path(engine_file).write_text(description)
    store = open_store(store_path)
    app = create_app(GatewayConfig(admin_key=admin_key, port=port), store, engine)
    try:
        from harnessrl.gateway.process import tune_gc
    except ImportError:  # an older harnessrl: default GC settings
        pass
    else:
        tune_gc()  # as run_gateway does
    try:  # the same uvicorn settings as run_gateway
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="on")
    finally:
        store.close()


# --- load generation -------------------------------------------------------------------------------------


class Target:
    """Where one conversation's calls go: ``url`` and headers, per conversation (rollouts made up front).

    ``pids``: the server processes a call to this target runs through (role -> pid), whose CPU time
    each batch records (``cpu_seconds``); the client's own CPU is added as ``client``.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.pids: dict[str, int] = {}

    async def prepare(self, session: Any, n: int) -> list[tuple[str, dict[str, str]]]:
        raise NotImplementedError


class Direct(Target):
    def __init__(self, base: str) -> None:
        super().__init__("direct")
        self.base = base

    async def prepare(self, session: Any, n: int) -> list[tuple[str, dict[str, str]]]:
        return [(f"{self.base}/v1/chat/completions", {"content-type": "application/json"})] * n


class Harnessrl(Target):
    def __init__(self, base: str, admin_key: str) -> None:
        super().__init__("harnessrl")
        self.base, self.admin_key = base, admin_key
        self.rollouts: list[str] = []

    async def prepare(self, session: Any, n: int) -> list[tuple[str, dict[str, str]]]:
        out = []
        for _ in range(n):
            async with session.post(
                f"{self.base}/api/rollouts",
                json={"task": {"bench": True}},
                headers={"authorization": f"Bearer {self.admin_key}"},
            ) as r:
                assert r.status == 201, await r.text()
                ro = await r.json()
            self.rollouts.append(ro["rollout_id"])
            out.append(
                (
                    f"{ro['base_url']}/chat/completions",
                    {"authorization": f"Bearer {ro['api_key']}", "content-type": "application/json"},
                )
            )
        return out


class AgentLightning(Target):
    def __init__(self, base: str) -> None:
        super().__init__("agentlightning")
        self.base = base
        self.count = 0

    async def prepare(self, session: Any, n: int) -> list[tuple[str, dict[str, str]]]:
        ids = [f"bench-{self.count + i}" for i in range(n)]
        self.count += n
        payload = [{"input": {"bench": True}, "rollout_id": rid} for rid in ids]
        async with session.post(f"{self.base}/api/rollouts", json=payload) as r:
            assert r.status == 201, await r.text()
        return [
            (
                f"{self.base}/proxy/rollout/{rid}/attempt/0/mode/train/openai/v1/chat/completions",
                {"content-type": "application/json"},
            )
            for rid in ids
        ]


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its live children (``/proc``, clock-tick resolution).

    Children count because a server may run its work in a worker process (uvicorn with workers,
    hydra launchers); threads are part of their process's times already.
    """
    total = 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name (field 2) may hold spaces: split after its closing parenthesis.
            fields = f.read().rpartition(")")[2].split()
        total += (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime (fields 14, 15)
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                total += sum(cpu_seconds(int(c)) for c in f.read().split())
    except (FileNotFoundError, ProcessLookupError):
        pass  # the process (or a child) exited: its time is gone with it
    return total


def _cpu_snapshot(target: Target) -> dict[str, float]:
    out = {role: cpu_seconds(pid) for role, pid in target.pids.items()}
    out["client"] = time.process_time()
    return out


async def run_batch(
    session: Any, target: Target, conversations: list[list[bytes]], n_conv: int, concurrency: int
) -> dict[str, Any]:
    """``n_conv`` conversations of ``TURNS`` calls with ``concurrency`` workers; latencies in seconds.

    ``cpu_s``: CPU seconds each process involved used during the batch (``target.pids`` and the client).
    """
    slots = await target.prepare(session, n_conv)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n_conv):
        queue.put_nowait(i)
    latencies: list[float] = []
    errors: list[str] = []

    async def worker() -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            url, headers = slots[i]
            for body in conversations[i % len(conversations)]:
                t0 = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as r:
                    data = await r.read()
                    if r.status != 200:
                        errors.append(f"{r.status}: {data[:200]!r}")
                latencies.append(time.perf_counter() - t0)

    load_before = os.getloadavg()[0]
    cpu_before = _cpu_snapshot(target)
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    cpu_after = _cpu_snapshot(target)
    cpu = {role: cpu_after[role] - cpu_before[role] for role in cpu_before}
    return {
        "latencies": latencies,
        "wall_s": wall,
        "errors": errors,
        "load_avg_1m": load_before,
        "cpu_s": cpu,
    }


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]


def summarize(batches: list[dict[str, Any]]) -> dict[str, Any]:
    lat = [x for b in batches for x in b["latencies"]]
    wall = sum(b["wall_s"] for b in batches)
    errors = [e for b in batches for e in b["errors"]]
    return {
        "requests": len(lat),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "req_s": round(len(lat) / wall, 1),
        "p50_ms": round(_pct(lat, 0.50) * 1000, 2),
        "p99_ms": round(_pct(lat, 0.99) * 1000, 2),
        "mean_ms": round(sum(lat) / len(lat) * 1000, 2),
        "per_round_req_s": [round(len(b["latencies"]) / b["wall_s"], 1) for b in batches],
        "load_avg_1m_per_round": [round(b["load_avg_1m"], 2) for b in batches],
        "cpu_ms_per_call": cpu_per_call(batches),
    }


def cpu_per_call(batches: list[dict[str, Any]]) -> dict[str, float]:
    """CPU milliseconds per call of each process (``upstream``, ``gateway``, ``client``) and their ``total``."""
    n = sum(len(b["latencies"]) for b in batches)
    roles = batches[0]["cpu_s"].keys()
    out = {role: round(sum(b["cpu_s"][role] for b in batches) / n * 1000, 3) for role in roles}
    out["total"] = round(sum(out.values()), 3)
    return out


def cpu_ceilings(level: dict[str, Any], cores: int) -> dict[str, Any]:
    """What the CPU numbers say about throughput on ``cores`` cores, per target and for the 0.8x goal.

    ``ceiling_req_s``: ``cores * 1000 / total CPU ms per call`` — the most calls per second the
    client, upstream and proxy together could make if they kept every core busy and nothing else ran.
    ``gateway_budget_ms_for_0_8x``: the proxy CPU per call at which that ceiling is 0.8x direct's,
    given the client's and upstream's CPU per call as measured through the proxy.
    """
    d = level["direct"]["cpu_ms_per_call"]
    direct_ceiling = cores * 1000 / d["total"]
    out: dict[str, Any] = {"cores": cores, "direct": _bounds(d, cores)}
    for name, s in level.items():
        if name in ("direct", "ratios_to_direct") or not isinstance(s, dict) or "cpu_ms_per_call" not in s:
            continue
        c = s["cpu_ms_per_call"]
        others = c["total"] - c.get("gateway", 0.0)
        budget = cores * 1000 / (0.8 * direct_ceiling) - others
        out[name] = {
            **_bounds(c, cores),
            "ceiling_x_direct": round(d["total"] / c["total"], 3),
            "gateway_cpu_ms": c.get("gateway"),
            "gateway_budget_ms_for_0_8x": round(budget, 3),
        }
    return out


def _bounds(cpu: dict[str, float], cores: int) -> dict[str, Any]:
    """``ceiling_req_s`` (all cores) and ``one_core_req_s`` per server process: a Python server runs its
    Python code on one core at a time (the GIL), so ``1000 / its CPU ms`` caps it whatever the cores;
    ``bound_req_s`` is the lower of them and ``bound_by`` says which one it is."""
    ceilings = {"all_cores": cores * 1000 / cpu["total"]}
    per_process = {
        role: round(1000 / ms, 1) for role, ms in cpu.items() if role not in ("client", "total") and ms > 0
    }
    ceilings.update(per_process)
    bound_by = min(ceilings, key=ceilings.__getitem__)
    return {
        "ceiling_req_s": round(ceilings["all_cores"], 1),
        "one_core_req_s": per_process,
        "bound_req_s": round(ceilings[bound_by], 1),
        "bound_by": bound_by,
    }


# --- processes -------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before answering {url}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code < 500:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout_s}s")


@contextlib.contextmanager
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


def agl_version(venv: Path) -> str:
    out = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import importlib.metadata as m, sys; print(m.version('agentlightning'), sys.version.split()[0])",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **OFFLINE_ENV},
    )
    return out.stdout.strip()


async def measure(
    args: argparse.Namespace, targets: list[Target], conversations: list[list[bytes]]
) -> dict[str, Any]:
    import aiohttp

    levels: dict[str, Any] = {}
    plan = [
        (1, args.rounds_c1, args.conversations_c1),
        (32, args.rounds_c32, 32 * args.conversations_per_worker),
    ]
    for concurrency, rounds, n_conv in plan:
        connector = aiohttp.TCPConnector(limit=concurrency * 2, force_close=False)
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=600)
        ) as session:
            for t in targets:  # warm-up: connections, caches, lazy imports
                await run_batch(session, t, conversations, max(1, concurrency // 4), min(concurrency, 8))
            batches: dict[str, list[dict[str, Any]]] = {t.name: [] for t in targets}
            for r in range(rounds):
                order = targets[r % len(targets) :] + targets[: r % len(targets)]
                for t in order:
                    batches[t.name].append(await run_batch(session, t, conversations, n_conv, concurrency))
                    b = batches[t.name][-1]
                    print(
                        f"  C={concurrency} round {r + 1}/{rounds} {t.name:15s} "
                        f"{len(b['latencies']) / b['wall_s']:7.1f} req/s  load {b['load_avg_1m']:.2f}"
                        f"{'  ERRORS ' + str(len(b['errors'])) if b['errors'] else ''}",
                        flush=True,
                    )
        level = {name: summarize(bs) for name, bs in batches.items()}
        d = level["direct"]
        level["ratios_to_direct"] = {
            name: {
                "throughput": round(s["req_s"] / d["req_s"], 3),
                "p50": round(s["p50_ms"] / d["p50_ms"], 3),
                "p99": round(s["p99_ms"] / d["p99_ms"], 3),
                "added_p50_ms": round(s["p50_ms"] - d["p50_ms"], 2),
                "added_p99_ms": round(s["p99_ms"] - d["p99_ms"], 2),
            }
            for name, s in level.items()
            if name != "direct"
        }
        level["cpu_ceilings"] = cpu_ceilings(level, os.cpu_count() or 1)
        levels[str(concurrency)] = level
    return levels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds and conversations")
    ap.add_argument("--no-agl", action="store_true", help="skip Agent Lightning")
    ap.add_argument("--agl-venv", type=Path, default=DEFAULT_AGL_VENV)
    ap.add_argument("--rounds-c1", type=int, default=6)
    ap.add_argument("--conversations-c1", type=int, default=2, help="conversations per C=1 batch")
    ap.add_argument("--rounds-c32", type=int, default=4)
    ap.add_argument("--conversations-per-worker", type=int, default=1, help="C=32 batch: 32 x this")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument(
        "--engine",
        choices=["auto", "vllm", "adapter"],
        default="auto",
        help="harnessrl's engine: VLLMEngine if present (auto), or the non-streaming adapter in this file",
    )
    ap.add_argument("--no-netns", action="store_true", help="do not re-run inside a loopback-only netns")
    ap.add_argument("--role", choices=["upstream", "harnessrl"], help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--upstream", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--admin-key", help=argparse.SUPPRESS)
    ap.add_argument("--engine-file", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.role == "upstream":
        serve_upstream(args.port)
        return
    if args.role == "harnessrl":
        serve_harnessrl(args.port, args.upstream, args.store, args.admin_key, args.engine_file, args.engine)
        return

    in_netns = os.environ.get(NETNS_ENV) == "1"
    if not in_netns and not args.no_netns and shutil.which("unshare") and shutil.which("ip"):
        probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
        if probe.returncode == 0:
            cmd = " ".join(["ip link set lo up && exec", *map(_quote, [sys.executable, *sys.argv])])
            os.execvpe("unshare", ["unshare", "-n", "sh", "-c", cmd], {**os.environ, NETNS_ENV: "1"})
    if args.quick:
        args.rounds_c1, args.conversations_c1, args.rounds_c32 = 2, 1, 1
    os.environ.update(OFFLINE_ENV)

    use_agl = not args.no_agl
    agl_info: dict[str, Any] = {"measured": False}
    if use_agl and not (args.agl_venv / "bin" / "agl-server").exists():
        agl_info["reason"] = f"{args.agl_venv}/bin/agl-server not found (see the module docstring)"
        use_agl = False

    tokenizer = _tokenizer()
    reply = build_reply(tokenizer)
    conversations = build_conversations(reply, count=8)
    me = str(Path(__file__).resolve())
    tmp = Path(tempfile.mkdtemp(prefix="gateway-overhead-"))
    admin_key = f"bench-{secrets.token_hex(8)}"
    load_start = os.getloadavg()
    started = time.time()
    with processes() as procs:
        up_port, hr_port = free_port(), free_port()
        upstream = f"http://127.0.0.1:{up_port}"
        procs.append(subprocess.Popen([sys.executable, me, "--role", "upstream", "--port", str(up_port)]))
        wait_http(f"{upstream}/health", procs[-1])
        store_path = tmp / "harnessrl.db"
        engine_file = tmp / "engine.txt"
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    me,
                    "--role",
                    "harnessrl",
                    "--port",
                    str(hr_port),
                    "--upstream",
                    upstream,
                    "--engine",
                    args.engine,
                    "--store",
                    str(store_path),
                    "--admin-key",
                    admin_key,
                    "--engine-file",
                    str(engine_file),
                ]
            )
        )
        hr = f"http://127.0.0.1:{hr_port}"
        wait_http(f"{hr}/api/health", procs[-1])
        targets: list[Target] = [Direct(upstream), Harnessrl(hr, admin_key)]
        targets[0].pids = {"upstream": procs[0].pid}
        targets[1].pids = {"upstream": procs[0].pid, "gateway": procs[1].pid}
        if use_agl:
            agl_port = free_port()
            agl_dir = tmp / "agl"
            agl_dir.mkdir()
            log = (tmp / "agl.log").open("wb")
            try:
                procs.append(
                    subprocess.Popen(
                        [
                            str(args.agl_venv / "bin" / "agl-server"),
                            "host=127.0.0.1",
                            f"port={agl_port}",
                            f"default_proxy.model_name={MODEL}",
                            f"hydra.run.dir={agl_dir}",
                        ],
                        cwd=agl_dir,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env={**os.environ, **OFFLINE_ENV},
                    )
                )
                agl = f"http://127.0.0.1:{agl_port}"
                wait_http(f"{agl}/healthz", procs[-1])
                import httpx

                r = httpx.post(f"{agl}/api/models", json=[{"model": MODEL, "endpoint": f"{upstream}/v1"}])
                r.raise_for_status()
                targets.append(AgentLightning(agl))
                targets[-1].pids = {"upstream": procs[0].pid, "gateway": procs[-1].pid}
                version, py = agl_version(args.agl_venv).split()
                agl_info = {
                    "measured": True,
                    "version": version,
                    "python": py,
                    "server": "agl-server (hydra entry point; uvicorn.run defaults as installed: "
                    "no uvloop/httptools in its deps, access log on, one worker)",
                    "recording": "in-memory event per call (request + response JSON), not durable",
                    "proxy_path": "/proxy/rollout/{id}/attempt/0/mode/train/openai/v1/chat/completions",
                }
            except Exception as exc:  # noqa: BLE001 - report, still measure the others
                agl_info = {
                    "measured": False,
                    "reason": f"{type(exc).__name__}: {exc}",
                    "log_tail": (tmp / "agl.log").read_text(errors="replace")[-2000:],
                }
                print(f"Agent Lightning not measured: {agl_info['reason']}", file=sys.stderr)
        print(f"targets: {[t.name for t in targets]}; upstream {upstream}", flush=True)
        levels = asyncio.run(measure(args, targets, conversations))
        engine_desc = engine_file.read_text()
        import httpx

        harness_target = targets[1]
        assert isinstance(harness_target, Harnessrl)
        calls = httpx.get(
            f"{hr}/api/rollouts/{harness_target.rollouts[-1]}/calls",
            headers={"authorization": f"Bearer {admin_key}"},
        ).json()
        metrics = httpx.get(f"{hr}/metrics", headers={"authorization": f"Bearer {admin_key}"}).text
        reuse = {
            line.split('result="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("harnessrl_prompt_reuse_total{")
        }
    shutil.rmtree(tmp, ignore_errors=True)

    c1, c32 = levels["1"]["ratios_to_direct"]["harnessrl"], levels["32"]["ratios_to_direct"]["harnessrl"]
    result = {
        "benchmark": "gateway_overhead",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "duration_s": round(time.time() - started, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_avg_start": [round(x, 2) for x in load_start],
            "load_avg_end": [round(x, 2) for x in os.getloadavg()],
            "network": "loopback-only network namespace" if in_netns else "host network, 127.0.0.1 only",
        },
        "settings": {
            "turns_per_conversation": TURNS,
            "output_tokens": OUTPUT_TOKENS,
            "streaming": False,
            "body_bytes_first_last": [len(conversations[0][0]), len(conversations[0][-1])],
            "harnessrl_prompt_tokens_first_last": [
                len(calls[0]["prompt_token_ids"]),
                len(calls[-1]["prompt_token_ids"]),
            ]
            if calls
            else None,
            "c1": {"rounds": args.rounds_c1, "conversations_per_round": args.conversations_c1},
            "c32": {"rounds": args.rounds_c32, "conversations_per_round": 32 * args.conversations_per_worker},
            "order": "interleaved rounds, order rotated each round",
            "client": "aiohttp, pre-serialized bodies, keep-alive",
        },
        "harnessrl": {
            "engine": engine_desc,
            "recording": "durable: SQLite store (WAL, synchronous=NORMAL), call committed before the answer",
            "calls_recorded_last_rollout": len(calls),
            "prompt_reuse_total": reuse,
        },
        "agentlightning": agl_info,
        "levels": levels,
        "goals": {
            "harnessrl_throughput_c32_ratio": c32["throughput"],
            "throughput_goal": 0.8,
            "throughput_met": c32["throughput"] >= 0.8,
            "harnessrl_added_p50_c1_ms": c1["added_p50_ms"],
            "added_p50_goal_ms": 1.5,
            "added_p50_met": c1["added_p50_ms"] <= 1.5,
            "cpu_c32": cpu_goal_line(levels["32"]["cpu_ceilings"]),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    print(f"wrote {args.out}")


def cpu_goal_line(ceilings: dict[str, Any]) -> str:
    """One sentence: the CPU-bound throughput ceilings at C=32 and the proxy CPU the 0.8x goal needs."""
    h = ceilings["harnessrl"]
    return (
        f"on {ceilings['cores']} cores the CPU ceiling is {ceilings['direct']['ceiling_req_s']} req/s direct and "
        f"{h['ceiling_req_s']} req/s through harnessrl ({h['ceiling_x_direct']}x; the gateway process alone "
        f"caps it at {h['one_core_req_s'].get('gateway')} req/s on one core); 0.8x direct needs the "
        f"gateway at <= {h['gateway_budget_ms_for_0_8x']} ms CPU per call (measured {h['gateway_cpu_ms']} ms)"
    )


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def print_table(result: dict[str, Any]) -> None:
    print(
        f"\n{'C':>3} {'target':15s} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'x direct req/s':>15} "
        f"{'x p50':>7} {'+p50 ms':>8}"
    )
    for c, level in result["levels"].items():
        for name, s in level.items():
            if name in ("ratios_to_direct", "cpu_ceilings"):
                continue
            r = level["ratios_to_direct"].get(name)
            extra = (
                f"{r['throughput']:15.3f} {r['p50']:7.2f} {r['added_p50_ms']:8.2f}"
                if r
                else f"{'1.000':>15} {'1.00':>7} {'0.00':>8}"
            )
            print(f"{c:>3} {name:15s} {s['req_s']:8.1f} {s['p50_ms']:8.2f} {s['p99_ms']:8.2f} {extra}")
    print(f"\n{'C':>3} {'target':15s} CPU ms per call (per process, total) -> CPU ceiling req/s")
    for c, level in result["levels"].items():
        for name, s in level.items():
            if name in ("ratios_to_direct", "cpu_ceilings"):
                continue
            cpu = s["cpu_ms_per_call"]
            parts = " ".join(f"{k}={v:.3f}" for k, v in cpu.items())
            b = level["cpu_ceilings"][name]
            print(
                f"{c:>3} {name:15s} {parts}  -> {b['ceiling_req_s']} (bound {b['bound_req_s']}: {b['bound_by']})"
            )
    g = result["goals"]
    print(g["cpu_c32"])
    print(
        f"goals: C=32 throughput {g['harnessrl_throughput_c32_ratio']:.3f}x direct (>= 0.8: "
        f"{g['throughput_met']}); C=1 added p50 {g['harnessrl_added_p50_c1_ms']:.2f} ms (<= 1.5: {g['added_p50_met']})"
    )


if __name__ == "__main__":
    main()
