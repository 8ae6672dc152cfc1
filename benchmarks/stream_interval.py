"""Stream interval: a streamed call's gateway CPU at a real decode pace, a token at a time and gathered.

``gateway_overhead.py``'s upstream answers at once, so its stream leg shows a stream at the fastest
the gateway can take it. A real engine sends a sequence's tokens one decode step apart (tens of
milliseconds on a busy GPU), and then each token is its own read, event and write unless the gateway
gathers them (``gateway.stream_interval_s``, docs/gateway.md "What reaches the client"). This script
measures that case, side by side in one run:

- an upstream: the tests' fake vLLM (``tests/fakes/vllm_server.py``) pacing every answer at
  ``--token-ms`` per token (streamed or not), answering a ``--tokens``-token turn;
- one harnessrl gateway per stream pace (``--paces``: ``stream_interval_s:stream_interval_tokens``
  pairs; ``0:1`` is a token at a time, ``0.05:16`` the default), each as ``harnessrl gateway`` runs it
  (``run_gateway``, ``engine.model = vllm:UPSTREAM``); the fake sends ``stream_interval`` tokens an
  event when asked, as vLLM does;
- ``--concurrency`` rollouts calling at once, ``--rounds`` rounds per target after a warm-up round:
  whole calls on the default gateway, streamed calls on each.

It prints and writes (``benchmarks/results/stream_interval.json``) the gateway's CPU per call, per
answer token and per streamed event, and each stream's CPU over a whole call's at the same token rate.

What it does not show: the CPU of the upstream and the client (theirs, not the gateway's), and time
to first token (the first token is sent at once at every interval; only later ones may wait).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # ``measure``
from measure import (  # noqa: E402
    cpu_sample,
    cpu_seconds_between,
    free_port,
    load_average,
    processes,
    shared_fakes,
    wait_http,
)

RESULTS = Path(__file__).parent / "results" / "stream_interval.json"
MODEL = "tiny"


def reply_ids(tokens: int) -> list[int]:
    """A plain-text assistant turn of about ``tokens`` tokens in the tiny model's template (ends with
    its stop token, so every call ends with ``stop``)."""
    from harnessrl.engines.scripted import render_turn
    from harnessrl.engines.tiny import tiny_model_dir
    from harnessrl.tokenizer import PolicyTokenizer

    tokenizer = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    words, ids = [], tokenizer.encode(render_turn({"content": ""}))
    while len(ids) < tokens:
        words.append(f"word{len(words)}")
        ids = tokenizer.encode(render_turn({"content": " ".join(words)}))
    return ids


def serve_upstream(port: int, tokens: int, token_ms: float) -> None:
    import uvicorn

    shared_fakes()
    from tests.fakes.vllm_server import FakeModel, create_vllm_app

    fake = FakeModel(reply_ids(tokens), model=MODEL, context_length=32768, record=False)
    fake.token_delay_s = token_ms / 1000
    uvicorn.run(create_vllm_app(fake), host="127.0.0.1", port=port, log_level="warning", access_log=False)


def serve_gateway(port: int, upstream: str, store: str, admin_key: str, pace: str) -> None:
    from harnessrl.config import EngineConfig, GatewayConfig
    from harnessrl.gateway.server import run_gateway

    interval_s, tokens = parse_pace(pace)
    gateway = GatewayConfig(
        admin_key=admin_key,
        host="127.0.0.1",
        port=port,
        stream_interval_s=interval_s,
        stream_interval_tokens=tokens,
    )
    run_gateway(gateway, EngineConfig(model=f"vllm:{upstream}", tokenizer="tiny", served_model=MODEL), store)


def parse_pace(pace: str) -> tuple[float, int]:
    """``"0.05:8"`` -> ``(0.05, 8)``: ``gateway.stream_interval_s`` and ``stream_interval_tokens``."""
    try:
        interval_s, tokens = pace.split(":")
        return float(interval_s), int(tokens)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a pace is INTERVAL_S:TOKENS, e.g. 0.05:8 (got {pace!r})") from None


def pace_list(text: str) -> list[str]:
    """``--paces``: comma-separated paces, each checked by ``parse_pace`` (argparse names a bad one, exit 2)."""
    paces = text.split(",")
    for pace in paces:
        parse_pace(pace)
    return paces


def default_pace() -> str:
    """The pace a gateway has when its config does not say (``GatewayConfig``'s defaults)."""
    from harnessrl.config import GatewayConfig

    fields = GatewayConfig.model_fields
    return f"{fields['stream_interval_s'].default:g}:{fields['stream_interval_tokens'].default}"


def new_rollouts(url: str, admin_key: str, count: int) -> list[dict[str, Any]]:
    """``count`` fresh rollouts (made before a round is measured: the control API's CPU is not a call's)."""
    import httpx

    with httpx.Client(timeout=60) as http:
        admin = {"authorization": f"Bearer {admin_key}"}
        return [http.post(f"{url}/api/rollouts", json={}, headers=admin).json() for _ in range(count)]


async def one_round(rollouts: list[dict[str, Any]], stream: bool) -> list[int]:
    """A call on each rollout, all at once; each stream's count of events."""
    import httpx

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=len(rollouts))) as http:

        async def call(rollout: dict[str, Any]) -> int:
            body = {"messages": [{"role": "user", "content": "Count."}], "max_tokens": 4096, "stream": stream}
            resp = await http.post(
                f"{rollout['base_url']}/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {rollout['api_key']}"},
            )
            if resp.status_code != 200 or (stream and not resp.text.rstrip().endswith("data: [DONE]")):
                raise RuntimeError(f"call failed: {resp.status_code} {resp.text[:200]}")
            return resp.text.count("data: {") if stream else 0

        return list(await asyncio.gather(*(call(r) for r in rollouts)))


def measure_target(
    pid: int, url: str, admin_key: str, args: argparse.Namespace, stream: bool
) -> dict[str, Any]:
    """Gateway CPU of ``args.rounds`` rounds of calls (after a warm-up round: connections, caches)."""
    asyncio.run(one_round(new_rollouts(url, admin_key, args.concurrency), stream))
    cpu, calls, events, wall = 0.0, 0, 0, 0.0
    for _ in range(args.rounds):
        rollouts = new_rollouts(url, admin_key, args.concurrency)
        before, began = cpu_sample(pid), time.monotonic()
        counts = asyncio.run(one_round(rollouts, stream))
        wall += time.monotonic() - began
        cpu += cpu_seconds_between(before, cpu_sample(pid))
        calls += len(counts)
        events += sum(counts)
    out = {
        "calls": calls,
        "gateway_cpu_ms_per_call": round(1000 * cpu / calls, 3),
        "gateway_cpu_us_per_token": round(1e6 * cpu / (calls * args.answer_tokens), 2),
        "wall_s_per_round": round(wall / args.rounds, 2),
    }
    if stream:
        out["events_per_call"] = round(events / calls, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--token-ms", type=float, default=20.0, help="the upstream's time per token (ms)")
    ap.add_argument("--tokens", type=int, default=128, help="answer length in tokens")
    ap.add_argument(
        "--paces",
        type=pace_list,
        default="0:1,0.05:1,0.05:8,0.05:16",
        help="stream_interval_s:stream_interval_tokens per gateway, comma-separated (0.05:16 is the default)",
    )
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--role", choices=["upstream", "gateway"], help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--upstream", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--admin-key", help=argparse.SUPPRESS)
    ap.add_argument("--pace", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "upstream":
        serve_upstream(args.port, args.tokens, args.token_ms)
        return
    if args.role == "gateway":
        serve_gateway(args.port, args.upstream, args.store, args.admin_key, args.pace)
        return
    paces = args.paces
    args.answer_tokens = len(reply_ids(args.tokens)) - 1  # what a call answers: up to the stop token
    me, key = str(Path(__file__).resolve()), secrets.token_hex(16)
    load_at_start = load_average()
    with tempfile.TemporaryDirectory(prefix="stream-interval-") as tmp, processes() as procs:
        port = free_port()
        upstream = f"http://127.0.0.1:{port}"
        common = ["--tokens", str(args.tokens), "--token-ms", str(args.token_ms)]
        procs.append(
            subprocess.Popen([sys.executable, me, "--role", "upstream", "--port", str(port), *common])
        )
        wait_http(f"{upstream}/health", procs[-1])
        gateways: dict[str, tuple[int, str]] = {}
        for n, pace in enumerate(paces):
            port = free_port()
            argv = ["--role", "gateway", "--port", str(port), "--upstream", upstream, "--admin-key", key]
            argv += ["--store", f"{tmp}/store-{n}.db", "--pace", pace]
            procs.append(subprocess.Popen([sys.executable, me, *argv]))
            wait_http(f"http://127.0.0.1:{port}/api/health", procs[-1])
            gateways[pace] = (procs[-1].pid, f"http://127.0.0.1:{port}")
        pid, url = gateways[paces[0]]
        whole = measure_target(pid, url, key, args, stream=False)
        print(f"whole call: {whole}", flush=True)
        streams = {}
        for pace, (pid, url) in gateways.items():
            streams[pace] = result = measure_target(pid, url, key, args, stream=True)
            result["vs_whole"] = round(
                result["gateway_cpu_ms_per_call"] / whole["gateway_cpu_ms_per_call"], 2
            )
            print(f"stream, pace {pace}: {result}", flush=True)
    out = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/stream_interval.py", *sys.argv[1:]]),
        "machine": {"cpus": len(os.sched_getaffinity(0)), "platform": platform.platform()},
        "load_average_at_start": load_at_start,
        "upstream": f"tests' fake vLLM, {args.token_ms:g} ms per token, {args.answer_tokens}-token answers",
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "whole": whole,
        "stream_by_pace": streams,
        "pace": "gateway.stream_interval_s:gateway.stream_interval_tokens",
        "default_pace": default_pace(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
