"""Before/after for a gateway change: two trees' gateways side by side in one run, per leg.

A change to the gateway's hot path is judged by its gateway CPU per call, and on a shared machine two
runs minutes apart differ by more than most changes do. This runs one fake upstream
(``gateway_overhead``'s) and two gateways, each as ``harnessrl gateway`` serves it
(``gateway_overhead.serve_harnessrl``): this tree's (``after``) and another checkout's (``before``,
``--before``, e.g. ``git worktree add --detach /tmp/before HEAD~3``; its ``src`` is put first on the
gateway's ``PYTHONPATH``). Every round runs every leg on both gateways, the order of legs and of sides
turning each round, so a slow phase of the machine hits both sides and all legs alike (a leg's ratio to
the chat leg is measured in the same rounds, unlike ``gateway_overhead``'s legs, which run one after
another). Prints and writes each side's gateway CPU per call per leg, each leg's over the chat leg's
(``over_chat``; ``stream`` over ``chat`` is the stream/whole ratio), and after/before per leg.

    git worktree add --detach /tmp/before HEAD
    .venv/bin/python benchmarks/gateway_before_after.py --before /tmp/before --legs chat,stream

Legs: ``gateway_overhead``'s (chat, stream, messages, responses), the same bodies, and the Messages and
Responses bodies streamed (``messages_stream``, ``responses_stream``: Claude Code and Codex CLI stream;
set them beside ``stream``); C = 1 by default (``--concurrency 32`` for the other level). No Agent
Lightning and no direct target: only the two gateways are compared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gateway_overhead as go  # noqa: E402

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent


ALL_LEGS = (*go.LEGS, *go.STREAMED_API_LEGS)


def parse_legs(text: str) -> list[str]:
    """``--legs``: a comma-separated subset of ``ALL_LEGS``, run in that order."""
    asked = {part.strip() for part in text.split(",") if part.strip()}
    if not asked or asked - set(ALL_LEGS):
        raise argparse.ArgumentTypeError(f"--legs takes some of {', '.join(ALL_LEGS)} (got {text!r})")
    return [leg for leg in ALL_LEGS if leg in asked]


def start_gateway(
    procs: list[subprocess.Popen[bytes]], tree: Path, upstream: str, tmp: Path, key: str
) -> str:
    port = go.free_port()
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    store = tmp / f"{tree.name}-{port}.db"
    role = [sys.executable, str(HERE.parent / "gateway_overhead.py"), "--role", "harnessrl"]
    args = ["--port", str(port), "--upstream", upstream, "--store", str(store), "--admin-key", key]
    procs.append(subprocess.Popen([*role, *args], env=env))
    url = f"http://127.0.0.1:{port}"
    go.wait_http(f"{url}/api/health", procs[-1])
    return url


async def compare(
    urls: dict[str, str], pids: dict[str, int], key: str, legs: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    import aiohttp

    tokenizer = go._tokenizer()
    reply = go.build_reply(tokenizer)
    bodies = go.leg_bodies(reply, 8)
    c = args.concurrency
    n_conv = args.conversations if c == 1 else 32 * args.conversations
    out: dict[str, Any] = {}
    connector = aiohttp.TCPConnector(limit=c * 2)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=600)
    ) as session:
        targets: dict[str, list[Any]] = {}
        for leg in legs:
            targets[leg] = []
            for side in ("before", "after"):
                t = go.Harnessrl(urls[side], key, go.LEG_APIS[leg])
                t.name, t.pids = side, {"gateway": pids[side]}
                targets[leg].append(t)
                await go.run_batch(session, t, bodies[leg], 1, 1, go.LEG_CHECKS[leg])  # warm-up
        # Every round runs every leg on both sides, the order turning: a leg's ratio to another (stream
        # over chat) is measured in the same rounds, as the two sides are.
        batches = {leg: {"before": [], "after": []} for leg in legs}
        for r in range(args.rounds):
            for leg in legs[r % len(legs) :] + legs[: r % len(legs)]:
                for t in targets[leg][r % 2 :] + targets[leg][: r % 2]:
                    batch = await go.run_batch(session, t, bodies[leg], n_conv, c, go.LEG_CHECKS[leg])
                    batches[leg][t.name].append(batch)
        for leg in legs:
            out[leg] = {name: go.summarize(bs) for name, bs in batches[leg].items()}
            cpu = {name: s["cpu_ms_per_call"]["gateway"] for name, s in out[leg].items()}
            out[leg]["after_over_before"] = round(cpu["after"] / cpu["before"], 3)
            print(
                f"{leg:9s} C={c} gateway CPU ms/call: before {cpu['before']:.3f}, after {cpu['after']:.3f}",
                flush=True,
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="the other checkout (its src/ is imported)")
    ap.add_argument("--legs", type=parse_legs, default=["chat", "stream"])
    ap.add_argument("--concurrency", type=int, choices=[1, 32], default=1)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--conversations", type=int, default=2, help="conversations per batch (x32 at C=32)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    os.environ.update(go.OFFLINE_ENV)
    key = f"bench-{secrets.token_hex(8)}"
    with tempfile.TemporaryDirectory(prefix="gateway-ab-") as tmp, go.processes() as procs:
        up_port = go.free_port()
        upstream = f"http://127.0.0.1:{up_port}"
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(HERE.parent / "gateway_overhead.py"),
                    "--role",
                    "upstream",
                    "--port",
                    str(up_port),
                ]
            )
        )
        go.wait_http(f"{upstream}/health", procs[-1])
        urls = {
            "before": start_gateway(procs, args.before.resolve(), upstream, Path(tmp), key),
            "after": start_gateway(procs, ROOT, upstream, Path(tmp), key),
        }
        pids = {"before": procs[1].pid, "after": procs[2].pid}
        legs = asyncio.run(compare(urls, pids, key, args.legs, args))
    result: dict[str, Any] = {
        "benchmark": "gateway_before_after",
        "before": str(args.before),
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "load_avg_1m": [round(x, 2) for x in os.getloadavg()],
        "legs": legs,
    }
    if "chat" in legs:
        result["over_chat"] = {
            leg: {
                side: round(
                    legs[leg][side]["cpu_ms_per_call"]["gateway"]
                    / legs["chat"][side]["cpu_ms_per_call"]["gateway"],
                    3,
                )
                for side in ("before", "after")
            }
            for leg in legs
            if leg != "chat"
        }
        print(f"gateway CPU per call over the chat leg's (same rounds): {result['over_chat']}")
    streams = [leg for leg in ("messages_stream", "responses_stream") if leg in legs]
    if "stream" in legs and streams:
        result["over_chat_stream"] = {
            leg: {
                side: round(
                    legs[leg][side]["cpu_ms_per_call"]["gateway"]
                    / legs["stream"][side]["cpu_ms_per_call"]["gateway"],
                    3,
                )
                for side in ("before", "after")
            }
            for leg in streams
        }
        print(f"streamed legs' gateway CPU per call over the chat stream leg's: {result['over_chat_stream']}")
    if "chat" in legs and "stream" in legs:
        result["stream_over_whole"] = {
            side: round(
                legs["stream"][side]["cpu_ms_per_call"]["gateway"]
                / legs["chat"][side]["cpu_ms_per_call"]["gateway"],
                3,
            )
            for side in ("before", "after")
        }
        print(f"stream / whole gateway CPU: {result['stream_over_whole']}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
