"""Gateway scaling: calls/s with 1 vs 2 gateway processes on the PostgreSQL store.

What is measured. One run starts a throwaway PostgreSQL server (``harnessrl.store.pg_server``), the
upstream of ``gateway_overhead.py`` (the fake vLLM server the tests use, ``tests/fakes/vllm_server.py``:
instant answers, a 256-token assistant turn with one Hermes tool call, token IDs and logprobs), and two gateways in front of it, both real
``python -m harnessrl.gateway`` processes with the ``vllm:`` engine and the ``tiny`` tokenizer on
their own PostgreSQL database:

- ``one``: ``--workers 1`` (one process, the ordinary gateway);
- ``two``: ``--workers 2`` (two processes behind one address, SO_REUSEPORT; each checks the store's
  call count before reusing its per-rollout memory, since the other may have served the last call).

The load is ``gateway_overhead.py``'s: agent-like 20-turn conversations (system prompt, tool schemas,
a tool call and a shell-like tool result per turn, growing to ~40 KB), one rollout each, the same
total client concurrency for both (default 32 conversations at once, aiohttp, keep-alive). Rounds
alternate which target goes first; the 1-minute load average is recorded per batch, and the calls each
worker served are read from its ``/metrics`` (through its control port) to show the kernel's spread.

What it does not show. The upstream is instant, so this is the gateway's own CPU ceiling (tokenizing,
prompt building, recording), not a run's throughput (there the engine dominates). Everything —
load generator, upstream, PostgreSQL, gateways — shares this machine's cores, so two gateway
processes can only help as far as idle cores exist: on a 2-core machine shared with other work the
ratio is bounded well below 2. Run it on a machine with spare cores to see the scaling itself.

Run (one command)::

    .venv/bin/python benchmarks/gateways_scaling.py            # ~2-3 min on 2 shared cores
    .venv/bin/python benchmarks/gateways_scaling.py --quick    # 1 round

Writes ``benchmarks/results/gateways_scaling.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import re
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gateway_overhead as go  # noqa: E402  (the upstream, the conversations and the load generator)
from measure import load_average  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results" / "gateways_scaling.json"


def start_gateway(
    procs: list[subprocess.Popen[Any]], workers: int, upstream: str, store_url: str, admin_key: str, log: Path
) -> tuple[str, list[str]]:
    """A ``python -m harnessrl.gateway`` with ``workers`` processes; its URL and control URLs."""
    port = go.free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harnessrl.gateway",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--model",
            f"vllm:{upstream}",
            "--tokenizer",
            "tiny",
            "--store",
            store_url,
        ],  # fmt: skip
        cwd=ROOT,
        env={**os.environ, **go.OFFLINE_ENV, "HARNESSRL_ADMIN_KEY": admin_key},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    procs.append(proc)
    url = f"http://127.0.0.1:{port}"
    go.wait_http(f"{url}/api/health", proc)
    controls: list[str] = []
    if workers > 1:
        deadline = time.monotonic() + 120
        while not controls:
            match = re.search(r"control ([^;]+);", log.read_text())
            if match:
                controls = [u.strip() for u in match.group(1).split(",")]
            elif time.monotonic() > deadline:
                raise RuntimeError(f"no control URLs in {log}")
            time.sleep(0.1)
        for control in controls:
            go.wait_http(f"{control}/api/health", proc)
    return url, controls or [url]


def calls_served(controls: list[str], admin_key: str) -> list[int]:
    """``harnessrl_calls_total`` of each worker (its own /metrics, through its control port)."""
    import httpx

    out = []
    for control in controls:
        text = httpx.get(
            f"{control}/metrics", headers={"authorization": f"Bearer {admin_key}"}, timeout=30
        ).text
        out.append(
            int(
                sum(float(v) for v in re.findall(r"^harnessrl_calls_total\{[^}]*\} ([0-9.e+]+)$", text, re.M))
            )
        )
    return out


async def measure(
    args: argparse.Namespace, targets: dict[str, go.Harnessrl], conversations: list[list[bytes]]
) -> dict[str, list[dict[str, Any]]]:
    import aiohttp

    c = args.concurrency
    batches: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
    connector = aiohttp.TCPConnector(limit=c * 2)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=600)
    ) as session:
        for t in targets.values():  # warm-up: connections, caches, lazy imports
            await go.run_batch(session, t, conversations, max(2, c // 4), min(c, 8))
        names = list(targets)
        for r in range(args.rounds):
            for name in names[r % 2 :] + names[: r % 2]:
                b = await go.run_batch(
                    session, targets[name], conversations, c * args.conversations_per_worker, c
                )
                batches[name].append(b)
                print(
                    f"  round {r + 1}/{args.rounds} {name:4s} {len(b['latencies']) / b['wall_s']:7.1f} calls/s"
                    f"  load {b['load_avg_1m']:.2f}{'  ERRORS ' + str(len(b['errors'])) if b['errors'] else ''}",
                    flush=True,
                )
    return batches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=32, help="conversations in flight at once")
    ap.add_argument("--conversations-per-worker", type=int, default=1, help="batch: concurrency x this")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if args.quick:
        args.rounds = 1
    from harnessrl.store.pg_server import ThrowawayPostgres

    started = time.monotonic()
    load_start = os.getloadavg()
    admin_key = f"bench-{secrets.token_hex(8)}"
    reply = go.build_reply(go._tokenizer())
    conversations = go.build_conversations(reply, 64)
    logs = Path(tempfile.mkdtemp(prefix="harnessrl-gateways-scaling-"))  # the gateways' logs
    with ThrowawayPostgres() as pg, go.processes() as procs:
        print(f"PostgreSQL ready in {pg.startup_s:.1f} s", flush=True)
        up_port = go.free_port()
        upstream = subprocess.Popen(
            [sys.executable, str(Path(go.__file__)), "--role", "upstream", "--port", str(up_port)],
            env={**os.environ, **go.OFFLINE_ENV},
        )
        procs.append(upstream)
        upstream_url = f"http://127.0.0.1:{up_port}"
        go.wait_http(f"{upstream_url}/health", upstream)
        gateways = {}
        for name, workers in (("one", 1), ("two", 2)):
            store_url = pg.create_database(f"bench_{name}")
            url, controls = start_gateway(
                procs, workers, upstream_url, store_url, admin_key, logs / f"{name}.log"
            )
            gateways[name] = (url, controls)
            print(f"gateway {name}: {url} ({workers} worker(s))", flush=True)
        targets = {name: go.Harnessrl(url, admin_key) for name, (url, _) in gateways.items()}
        before = {name: calls_served(controls, admin_key) for name, (_, controls) in gateways.items()}
        batches = asyncio.run(measure(args, targets, conversations))
        after = {name: calls_served(controls, admin_key) for name, (_, controls) in gateways.items()}
    summary = {name: go.summarize(bs) for name, bs in batches.items()}
    one, two = summary["one"]["req_s"], summary["two"]["req_s"]
    result = {
        "benchmark": "gateways_scaling",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - started, 1),
        "one_gateway_calls_per_s": one,
        "two_gateways_calls_per_s": two,
        "ratio": round(two / one, 3) if one else None,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_avg_start": [round(x, 2) for x in load_start],
            "load_avg_end": load_average(),
        },
        "settings": {
            "store": "PostgreSQL (throwaway server, fsync off), one database per gateway",
            "engine": "vllm: engine against the fake vLLM server (tests/fakes/vllm_server.py) gateway_overhead.py serves",
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "conversations_per_batch": args.concurrency * args.conversations_per_worker,
            "turns_per_conversation": go.TURNS,
            "output_tokens": go.OUTPUT_TOKENS,
            "streaming": False,
        },
        "calls_served_per_worker": {
            name: [a - b for a, b in zip(after[name], before[name], strict=True)] for name in after
        },
        "one": summary["one"],
        "two": summary["two"],
    }
    print()
    print(f"{'gateways':>9} {'calls/s':>9} {'p50 ms':>9} {'p99 ms':>9}  per-round calls/s (load avg)")
    for name, n in (("one", 1), ("two", 2)):
        s = summary[name]
        rounds = ", ".join(
            f"{x} ({la})" for x, la in zip(s["per_round_req_s"], s["load_avg_1m_per_round"], strict=True)
        )
        print(f"{n:>9} {s['req_s']:>9} {s['p50_ms']:>9} {s['p99_ms']:>9}  {rounds}")
    print(f"ratio two/one: {result['ratio']}; calls per worker: {result['calls_served_per_worker']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
