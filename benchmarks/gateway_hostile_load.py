"""Gateway under load with its transport stressed: many rollouts, two kinds of client pools, a pause, idle sockets.

What is measured. One run starts the gateway as ``python -m harnessrl.gateway`` serves it (uvicorn
with the gateway's own connection protocol and its default timeouts, a SQLite store in a temporary
folder, the scripted engine: instant, deterministic tool-calling turns, the ``tiny`` model's
tokenizer) in a subprocess, and drives it from this process with asyncio + httpx:

- ``--rollouts`` rollouts (500) of ``--turns`` calls each (5): an append-only agent loop that keeps
  its message list, appends each assistant message as returned (content and tool calls) and a tool
  result, with 0-0.3 s of think time between calls. Half the rollouts stream (SSE, assembled from
  the deltas), half do not.
- Half the rollouts share one client pool (one ``httpx.AsyncClient``, 64 connections, httpx's
  default 5 s keep-alive expiry: the pool whose connections the server closed under it at exactly
  5 s before), the other half get one client each.
- When half the calls are answered, the gateway is paused (``POST /api/pause``) for ``--pause-s``
  seconds (5: so pooled connections sit idle for the 5 s the race needed) and resumed; calls sent
  meanwhile wait at the gate.
- ``--idle`` connections (1,000) are opened first, each makes one ``GET /api/health`` and then stays
  open and idle for the whole run, holding file descriptors as a crowd of idle clients would.

Every client error (exception or non-200) is counted, with no retries. At the end every rollout's
calls are read back through the control API and checked: as many calls as turns, each recorded
once, in order (``seq`` increasing, call index = turn), token-exact (the response token IDs are the
scripted turn's own, the answer recorded is the one the client got, and each prompt starts with the
previous prompt + response: the append-only history was recognized). Reported: calls/s over the
load phase, p50/p99 call latency, the gateway process's CPU ms per call (``/proc/PID/stat``), and
the client's (this process's), and how many idle connections were still open at the pause and at
the end (an idle connection is closed after ``gateway.keepalive_timeout_s``, 75 s: a run longer than
that ends with none).

Then hostile clients (``--hostile`` per behaviour, 8; issue 36), against a second gateway started as
``python -m harnessrl gateway --set ...`` with one long scripted answer (10,000 tokens) and short
slow-reader settings (``HOSTILE_SETTINGS``): clients that stay (the control), leave after 0.3 s (an
SDK's timeout), half-close, reset, read 160 bytes a second (slow readers, streams with logprobs),
whose rollout is finished 0.2 s into the call, and that send ``Upgrade: h2c``; all three APIs,
streamed or not (raw sockets). Then calls sent to a paused gateway whose clients leave before the
resume, a 64 MiB header line beside ``/api/health`` calls, and a head of 150 headers. Checked: every
rollout holds exactly the calls whose client received the final event, the controls got theirs,
nothing was generated for the calls that left the pause, 431 for the oversized heads. Reported:
calls dropped by reason and API, tokens generated for them, the gateway's peak RSS, its CPU, how
much of the header flood it took before closing, and health latency meanwhile.

What it does not show. The engine is instant, so this is the gateway's own cost under a crowd, not
a training run's; client and gateway share the machine's cores (2 here), so calls/s partly measures
the client. The idle connections are loopback sockets in this process.

Run::

    .venv/bin/python benchmarks/gateway_hostile_load.py                 # ~1-3 min on 2 CPU cores
    .venv/bin/python benchmarks/gateway_hostile_load.py --rollouts 50 --idle 100 --pause-s 1   # seconds

Writes ``benchmarks/results/gateway_hostile_load.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import random
import resource
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from measure import cpu_seconds

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results" / "gateway_hostile_load.json"
ADMIN_KEY = "bench-admin-key"
SHARED_POOL_CONNECTIONS = 64


def script_turns(turns: int) -> list[dict[str, Any]]:
    """Tool-calling turns (the last one answers in text), unicode and multi-line arguments included."""
    out: list[dict[str, Any]] = []
    commands = ["ls -la", "python -m pytest tests/ -x -q 2>&1 | tail -n 20", "grep -rn 'def parse' src/"]
    for k in range(turns - 1):
        out.append(
            {
                "content": f"Step {k + 1}: let me look — ünïcode and a newline\nhere.",
                "tool_calls": [{"name": "bash", "arguments": {"command": commands[k % len(commands)]}}],
                "reasoning": "checking the tree first" if k % 2 else None,
            }
        )
    out.append({"content": "The fix is in place and the tests pass."})
    return out


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def raise_fd_limit(needed: int) -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


@dataclass
class Rollout:
    rollout_id: str
    base_url: str
    api_key: str
    stream: bool
    shared: bool
    answers: list[dict[str, Any]] = field(default_factory=list)  # assistant messages as received
    latencies_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def sse_message(response: httpx.Response) -> dict[str, Any]:
    """The assistant message a streamed chat answer adds up to."""
    content: list[str] = []
    calls: list[dict[str, Any]] = []
    async for line in response.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            raise RuntimeError(f"error event: {chunk['error']}")
        for choice in chunk.get("choices", []):
            delta = choice.get("delta", {})
            if delta.get("content"):
                content.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                calls.append({"id": tc["id"], "type": "function", "function": tc["function"]})
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if calls:
        message["tool_calls"] = calls
    return message


async def run_rollout(
    r: Rollout, client: httpx.AsyncClient, turns: int, rng: random.Random, progress: dict[str, Any]
) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the bash tool."},
        {"role": "user", "content": f"Task {r.rollout_id}: make the tests pass."},
    ]
    headers = {"Authorization": f"Bearer {r.api_key}"}
    for turn in range(turns):
        body = {"model": "bench", "messages": messages, "tools": TOOLS, "stream": r.stream}
        began = time.monotonic()
        try:
            if r.stream:
                async with client.stream(
                    "POST", f"{r.base_url}/chat/completions", json=body, headers=headers
                ) as resp:
                    if resp.status_code != 200:
                        await resp.aread()
                        raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
                    message = await sse_message(resp)
            else:
                resp = await client.post(f"{r.base_url}/chat/completions", json=body, headers=headers)
                if resp.status_code != 200:
                    raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
                message = resp.json()["choices"][0]["message"]
        except Exception as exc:  # counted, not retried: the benchmark asserts there are none
            r.errors.append(f"turn {turn}: {type(exc).__name__}: {exc}")
            return
        r.latencies_s.append(time.monotonic() - began)
        r.answers.append(message)
        progress["done"] += 1
        if progress["done"] >= progress["pause_at"] and not progress["paused"].is_set():
            progress["paused"].set()
        messages = [*messages, {k: v for k, v in message.items() if v is not None}]
        for tc in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": f"output of turn {turn}\n"})
        await asyncio.sleep(rng.uniform(0.0, 0.3))  # think time


async def hold_idle(url: str, count: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    host, port = url.removeprefix("http://").split(":")
    held = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        held.append((reader, writer))
    return held


def still_open(held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> int:
    return sum(1 for reader, writer in held if not reader.at_eof() and not writer.is_closing())


async def drive(url: str, args: argparse.Namespace, gateway_pid: int) -> dict[str, Any]:
    admin = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60)
    held = await hold_idle(url, args.idle)
    rollouts: list[Rollout] = []
    for i in range(args.rollouts):
        resp = await admin.post("/api/rollouts", json={"task": {"i": i}})
        resp.raise_for_status()
        d = resp.json()
        rollouts.append(
            Rollout(d["rollout_id"], d["base_url"], d["api_key"], stream=i % 2 == 0, shared=i % 4 < 2)
        )
    timeout = httpx.Timeout(120.0)
    shared = httpx.AsyncClient(
        timeout=timeout,
        limits=httpx.Limits(
            max_connections=SHARED_POOL_CONNECTIONS, max_keepalive_connections=SHARED_POOL_CONNECTIONS
        ),
    )
    own = {r.rollout_id: httpx.AsyncClient(timeout=timeout) for r in rollouts if not r.shared}
    total = args.rollouts * args.turns
    progress: dict[str, Any] = {"done": 0, "pause_at": total // 2, "paused": asyncio.Event()}
    pause_info: dict[str, Any] = {}

    async def pause_in_the_middle() -> None:
        await progress["paused"].wait()
        began = time.monotonic()
        result = (await admin.post("/api/pause", params={"timeout": 60})).json()
        pause_info["pause"] = result
        pause_info["calls_done_at_pause"] = progress["done"]
        pause_info["idle_connections_open"] = still_open(held)
        await asyncio.sleep(args.pause_s)
        pause_info["resume"] = (await admin.post("/api/resume")).json()
        pause_info["held_s"] = round(time.monotonic() - began, 2)

    rng = random.Random(args.seed)
    cpu_before = cpu_seconds(gateway_pid)
    client_cpu_before = time.process_time()
    began = time.monotonic()
    pauser = asyncio.create_task(pause_in_the_middle())
    await asyncio.gather(
        *(
            run_rollout(
                r,
                shared if r.shared else own[r.rollout_id],
                args.turns,
                random.Random(rng.random()),
                progress,
            )
            for r in rollouts
        )
    )
    wall = time.monotonic() - began
    cpu = cpu_seconds(gateway_pid) - cpu_before
    client_cpu = time.process_time() - client_cpu_before
    if not pauser.done():
        pauser.cancel()
    idle_open = still_open(held)
    for _, writer in held:
        writer.close()
    await shared.aclose()
    for c in own.values():
        await c.aclose()
    checks = await check_store(admin, rollouts, args.turns)
    await admin.aclose()
    latencies = sorted(s for r in rollouts for s in r.latencies_s)
    errors = [f"{r.rollout_id} {e}" for r in rollouts for e in r.errors]
    calls = len(latencies)

    def pct(q: float) -> float:
        return (
            round(1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))], 2) if latencies else 0.0
        )

    by_pool = {}
    for name, shared_pool in (("shared_pool", True), ("own_pool", False)):
        ms = sorted(1000 * x for r in rollouts if r.shared is shared_pool for x in r.latencies_s)
        if ms:
            by_pool[name] = {
                "p50_ms": round(ms[len(ms) // 2], 2),
                "p99_ms": round(ms[int(0.99 * len(ms))], 2),
            }
    return {
        "calls": calls,
        "latency_by_pool": by_pool,
        "client_errors": len(errors),
        "client_error_samples": errors[:10],
        "calls_per_s": round(calls / wall, 1),
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "mean_ms": round(1000 * statistics.fmean(latencies), 2) if latencies else 0.0,
        "wall_s": round(wall, 2),
        "gateway_cpu_ms_per_call": round(1000 * cpu / max(1, calls), 2),
        "client_cpu_ms_per_call": round(1000 * client_cpu / max(1, calls), 2),
        "idle_connections_held": args.idle,
        "idle_connections_open_at_end": idle_open,
        "pause": pause_info,
        "checks": checks,
    }


async def check_store(admin: httpx.AsyncClient, rollouts: list[Rollout], turns: int) -> dict[str, Any]:
    from harnessrl.engines.scripted import ScriptedEngine

    engine = ScriptedEngine(script_turns(turns))
    problems: list[str] = []
    counts = {"recorded_once": 0, "in_order": 0, "token_exact": 0, "answer_as_received": 0}
    for r in rollouts:
        calls = (await admin.get(f"/api/rollouts/{r.rollout_id}/calls")).json()
        expected = len(r.answers)
        if len(calls) != expected or expected != turns:
            problems.append(f"{r.rollout_id}: {len(calls)} recorded, {expected} answered of {turns}")
            continue
        counts["recorded_once"] += 1
        seqs = [c["seq"] for c in calls]
        if seqs == sorted(seqs) and len(set(seqs)) == len(seqs):
            counts["in_order"] += 1
        else:
            problems.append(f"{r.rollout_id}: seq out of order {seqs}")
        exact = all(c["response_token_ids"] == engine.turn_token_ids(k) for k, c in enumerate(calls))
        for k in range(1, len(calls)):
            prev = calls[k - 1]["prompt_token_ids"] + calls[k - 1]["response_token_ids"]
            exact = exact and calls[k]["prompt_token_ids"][: len(prev)] == prev
        if exact:
            counts["token_exact"] += 1
        else:
            problems.append(f"{r.rollout_id}: not token-exact")
        # A stream's content is sent untrimmed (the text as sampled, up to the tool call) and recorded
        # trimmed, as the non-streaming answer has it (docs/gateway.md); tool calls are the same.
        diffs = [
            (c["response"], a)
            for c, a in zip(calls, r.answers, strict=True)
            if (c["response"].get("content") or "").strip() != (a.get("content") or "").strip()
            or (c["response"].get("tool_calls") or []) != (a.get("tool_calls") or [])
        ]
        if not diffs:
            counts["answer_as_received"] += 1
        else:
            problems.append(f"{r.rollout_id}: recorded answer differs from the one received: {diffs[0]}")
    return {**counts, "rollouts": len(rollouts), "problems": problems[:10], "ok": not problems}


def start_gateway(
    folder: Path, script: Path, store: Path, settings: list[str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    """The gateway as a user starts it: ``python -m harnessrl.gateway``, or ``python -m harnessrl
    gateway --set ...`` when there are ``settings``."""
    env = {**os.environ, "HARNESSRL_ADMIN_KEY": ADMIN_KEY, "HF_HUB_OFFLINE": "1"}
    module = ["harnessrl", "gateway"] if settings else ["harnessrl.gateway"]
    cmd = [
        sys.executable,
        "-m",
        *module,
        "--model",
        f"scripted:{script}",
        "--port",
        "0",
        "--store",
        str(store),
    ]
    for setting in settings or []:
        cmd += ["--set", setting]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "listening on" in line:
            return proc, line.split("listening on ")[1].split()[0]
    raise RuntimeError("the gateway did not start")


# -- hostile clients (issue 36): calls whose harness never received them must leave no record -------

#: One long scripted answer (10,000 tokens, ~3.5 MB streamed with logprobs), so that clients leave
#: mid-generation and slow readers fall behind even with the instant scripted engine.
LONG_TURN = "word " * 10_000
HOSTILE_SETTINGS = [  # as a user would set them; short windows so that a slow reader is cut in seconds
    "engine.context_length=12288",
    "gateway.slow_reader_window_s=1",
    "gateway.slow_reader_bytes_per_s=20000",
    "gateway.stream_buffer_bytes=65536",
]
HOSTILE_APIS = {"chat": "chat/completions", "responses": "responses", "messages": "messages"}


@dataclass
class Hostile:
    behaviour: str
    api: str
    stream: bool
    rollout_id: str = ""
    api_key: str = ""
    received_final: bool = False
    status: int = 0


def hostile_request(h: Hostile, *, extra_headers: tuple[str, ...] = (), logprobs: bool = False) -> bytes:
    if h.api == "chat":
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "go"}]}
        if logprobs:
            body["logprobs"] = True
    elif h.api == "responses":
        body = {"model": "m", "input": "go"}
    else:
        body = {"model": "m", "max_tokens": 11_000, "messages": [{"role": "user", "content": "go"}]}
    raw = json.dumps({**body, "stream": h.stream}).encode()
    head = [
        f"POST /rollouts/{h.rollout_id}/v1/{HOSTILE_APIS[h.api]} HTTP/1.1",
        "Host: 127.0.0.1",
        f"x-api-key: {h.api_key}",
        "Content-Type: application/json",
        f"Content-Length: {len(raw)}",
        *extra_headers,
    ]
    if not any(line.lower().startswith("connection:") for line in extra_headers):
        head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + raw


def got_final(h: Hostile, answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    h.status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0
    if h.status != 200:
        return False
    if not h.stream:
        return b'"usage"' in body
    if h.api == "responses":
        return b"event: response.completed" in body or b"event: response.incomplete" in body
    if h.api == "messages":
        return b"event: message_stop" in body and b"event: error" not in body
    return b"data: [DONE]" in body and b'data: {"error"' not in body


def read_all(sock: socket.socket) -> bytes:
    got = b""
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except (ConnectionResetError, TimeoutError):
            return got
        if not chunk:
            return got
        got += chunk


def run_hostile(url: str, admin: httpx.Client, h: Hostile) -> None:
    """One client of ``h.behaviour``; sets ``h.received_final``."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if h.behaviour == "slow_reader":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(180)
    sock.connect((host, int(port)))
    extra: tuple[str, ...] = ()
    if h.behaviour == "h2c":  # what curl --http2 sends on http://
        extra = ("Connection: Upgrade, HTTP2-Settings, close", "Upgrade: h2c", "HTTP2-Settings: AAMAAABk")
    try:
        sock.sendall(hostile_request(h, extra_headers=extra, logprobs=h.behaviour == "slow_reader"))
        if h.behaviour in ("leaves", "resets", "paused_then_left"):
            time.sleep(0.3)  # an SDK's short read timeout: it closes the connection
            if h.behaviour == "resets":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return
        if h.behaviour == "half_closes":
            sock.shutdown(socket.SHUT_WR)
        elif h.behaviour == "finished_mid_call":
            time.sleep(0.2)
            admin.post(f"/api/rollouts/{h.rollout_id}/finish", json={"outcome": "success", "reward": 0.0})
        elif h.behaviour == "slow_reader":
            got = b""
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # 160 bytes a second
                try:
                    chunk = sock.recv(16)
                except (ConnectionResetError, TimeoutError):
                    break
                if not chunk:
                    break
                got += chunk
                time.sleep(0.1)
            h.received_final = got_final(h, got)
            return
        h.received_final = got_final(h, read_all(sock))
    finally:
        sock.close()


def prometheus(url: str, admin: httpx.Client) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in admin.get("/metrics").text.splitlines():
        if line.startswith("harnessrl_") and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def head_flood(url: str, megabytes: int) -> dict[str, Any]:
    """An unauthenticated request whose header line never ends, beside /api/health calls."""
    host, port = url.removeprefix("http://").split(":")
    sent = {"bytes": 0}

    def flood() -> None:
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"GET /api/health HTTP/1.1\r\nHost: x\r\nX-Flood: ")
            block = b"a" * 65536
            try:
                while sent["bytes"] < megabytes * 2**20:
                    sock.sendall(block)
                    sent["bytes"] += len(block)
            except OSError:
                pass

    thread = threading.Thread(target=flood)
    thread.start()
    health_ms = []
    with httpx.Client(base_url=url, timeout=30) as http:
        while thread.is_alive() or len(health_ms) < 5:
            began = time.monotonic()
            assert http.get("/api/health").status_code == 200
            health_ms.append(1000 * (time.monotonic() - began))
    thread.join()
    many = (
        b"GET /api/health HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-H%d: v\r\n" % i for i in range(150))
        + b"\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(many)
        too_many = read_all(sock).split(b"\r\n", 1)[0].decode()
    return {
        "header_line_mib_offered": megabytes,
        "header_bytes_taken_before_close": sent["bytes"],
        "health_during_flood_ms": {
            "max": round(max(health_ms), 1),
            "p50": round(statistics.median(health_ms), 1),
        },
        "150_headers": too_many,
    }


def hostile_phase(folder: Path, per_behaviour: int) -> dict[str, Any]:
    """Hostile clients against a gateway of their own (long answers), then the checks."""
    script = folder / "long.json"
    script.write_text(json.dumps({"turns": [LONG_TURN]}))
    proc, url = start_gateway(folder, script, folder / "hostile.db", HOSTILE_SETTINGS)
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # type: ignore[union-attr]
    try:
        admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60)
        cpu_before = cpu_seconds(proc.pid)
        behaviours = ["stays", "leaves", "half_closes", "resets", "slow_reader", "finished_mid_call", "h2c"]
        apis = sorted(HOSTILE_APIS)
        clients: list[Hostile] = []
        for b in behaviours:
            for i in range(per_behaviour):
                api = "chat" if b == "slow_reader" else apis[i % 3]
                stream = True if b == "slow_reader" else i % 2 == 0
                clients.append(Hostile(b, api, stream))
        for h in clients:
            d = admin.post("/api/rollouts", json={"task": {"hostile": h.behaviour}}).json()
            h.rollout_id, h.api_key = d["rollout_id"], d["api_key"]
        began = time.monotonic()
        threads = [threading.Thread(target=run_hostile, args=(url, admin, h)) for h in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        crowd_s = time.monotonic() - began
        # Clients that leave while the gateway is paused: none of their calls may be generated at resume.
        before = prometheus(url, admin)
        admin.post("/api/pause", params={"timeout": 0})
        paused = [Hostile("paused_then_left", apis[i % 3], i % 2 == 0) for i in range(per_behaviour)]
        for h in paused:
            d = admin.post("/api/rollouts", json={"task": {"hostile": h.behaviour}}).json()
            h.rollout_id, h.api_key = d["rollout_id"], d["api_key"]
        threads = [threading.Thread(target=run_hostile, args=(url, admin, h)) for h in paused]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        deadline = time.monotonic() + 30
        while admin.get("/api/state").json()["waiting"] and time.monotonic() < deadline:
            time.sleep(0.05)
        waiting_after_they_left = admin.get("/api/state").json()["waiting"]
        admin.post("/api/resume")
        after = prometheus(url, admin)
        flood = head_flood(url, 64)
        cpu = cpu_seconds(proc.pid) - cpu_before
        rss_kb = next(
            int(line.split()[1])
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
            if line.startswith("VmHWM")
        )
        time.sleep(1.0)  # the drop counts' store writes are in the background: let them land
        metrics = prometheus(url, admin)
        by_behaviour: dict[str, dict[str, int]] = {}
        problems = []
        for h in clients + paused:
            recorded = len(admin.get(f"/api/rollouts/{h.rollout_id}/calls").json())
            row = by_behaviour.setdefault(h.behaviour, {"clients": 0, "received_final": 0, "recorded": 0})
            row["clients"] += 1
            row["received_final"] += h.received_final
            row["recorded"] += recorded
            if recorded != (1 if h.received_final else 0):
                problems.append(
                    f"{h.behaviour} {h.api} stream={h.stream}: recorded {recorded}, final {h.received_final}"
                )
            if h.behaviour in ("stays", "h2c") and not h.received_final:
                problems.append(f"{h.behaviour} {h.api} stream={h.stream}: no answer (status {h.status})")
        dropped = {
            k.split("reason=")[1].split('"')[1] + "/" + k.split('api="')[1].split('"')[0]: v
            for k, v in metrics.items()
            if k.startswith("harnessrl_calls_dropped_total{")
        }
        generated_while_paused = after.get("harnessrl_dropped_tokens_total", 0.0) - before.get(
            "harnessrl_dropped_tokens_total", 0.0
        )
        if generated_while_paused or waiting_after_they_left:
            problems.append(
                f"paused: {generated_while_paused} tokens generated, {waiting_after_they_left} left waiting"
            )
        if not flood["150_headers"].startswith("HTTP/1.1 431"):
            problems.append(f"150 headers: {flood['150_headers']}")
        return {
            "per_behaviour": per_behaviour,
            "answer_tokens": len(LONG_TURN.split()),
            "settings": HOSTILE_SETTINGS,
            "by_behaviour": by_behaviour,
            "dropped_by_reason_and_api": dropped,
            "dropped_tokens": metrics.get("harnessrl_dropped_tokens_total", 0.0),
            "calls_recorded": metrics.get("harnessrl_calls_total", 0.0)
            + sum(v for k, v in metrics.items() if k.startswith("harnessrl_calls_total{")),
            "paused_then_left": {
                "waiting_after_they_left": waiting_after_they_left,
                "tokens_generated": generated_while_paused,
            },
            "crowd_s": round(crowd_s, 2),
            "gateway_cpu_s": round(cpu, 2),
            "gateway_peak_rss_mb": round(rss_kb / 1024, 1),
            "request_heads": flood,
            "problems": problems[:10],
            "ok": not problems,
        }
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=500)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--idle", type=int, default=1000, help="idle keep-alive connections held alongside")
    parser.add_argument("--pause-s", type=float, default=5.0, help="how long the mid-run pause holds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--hostile", type=int, default=8, help="hostile clients per behaviour in the second phase (0: none)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    # This process holds the idle sockets and up to one pool per rollout; the gateway (which
    # inherits the limit) one socket per client connection.
    needed = args.idle + args.rollouts + SHARED_POOL_CONNECTIONS + 256
    soft, hard = raise_fd_limit(2 * needed)
    if soft != resource.RLIM_INFINITY and soft < needed:
        sys.exit(f"open-file limit {soft} (hard {hard}) is below the {needed} this run needs; lower --idle")
    with tempfile.TemporaryDirectory(prefix="hrl-hostile-") as tmp:
        script = Path(tmp) / "script.json"
        script.write_text(json.dumps({"turns": script_turns(args.turns)}))
        proc, url = start_gateway(Path(tmp), script, Path(tmp) / "harnessrl.db")
        try:
            load_before = os.getloadavg()
            result = asyncio.run(drive(url, args, proc.pid))
            load_after = os.getloadavg()
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        hostile = hostile_phase(Path(tmp), args.hostile) if args.hostile else None
    import httpx as _httpx
    import uvicorn

    out = {
        "benchmark": "gateway_hostile_load",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "settings": {
            "rollouts": args.rollouts,
            "turns": args.turns,
            "streaming_share": 0.5,
            "shared_pool_share": 0.5,
            "shared_pool_connections": SHARED_POOL_CONNECTIONS,
            "idle_connections": args.idle,
            "pause_s": args.pause_s,
            "engine": "scripted (instant), tiny tokenizer",
            "store": "SQLite (temporary file)",
            "fd_limit": [soft, hard],
        },
        **result,
        "hostile_clients": hostile,
        "loadavg_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "versions": {"httpx": _httpx.__version__, "uvicorn": uvicorn.__version__},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    summary = {k: out[k] for k in ("calls", "client_errors", "calls_per_s", "p50_ms", "p99_ms")}
    summary["gateway_cpu_ms_per_call"] = out["gateway_cpu_ms_per_call"]
    summary["idle_open_at_end"] = f"{out['idle_connections_open_at_end']}/{args.idle}"
    summary["checks_ok"] = out["checks"]["ok"]
    if hostile is not None:
        summary["hostile_ok"] = hostile["ok"]
        summary["dropped_tokens"] = hostile["dropped_tokens"]
    print(json.dumps(summary))
    print(f"wrote {args.out}")
    if out["client_errors"] or not out["checks"]["ok"] or (hostile is not None and not hostile["ok"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
