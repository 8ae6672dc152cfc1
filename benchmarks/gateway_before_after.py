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

``--before-python``: the interpreter of the ``before`` gateway (default: this one), for the same tree
on another Python (a venv with harnessrl's dependencies, e.g. ``python3.12 -m venv /tmp/v312 &&
/tmp/v312/bin/pip install .``, then ``--before . --before-python /tmp/v312/bin/python``). Both
gateways are given this process's tiny tokenizer folder: the tiny tokenizer is trained on the running
Python's standard library, so another Python would build another vocabulary, read the fake upstream's
token IDs as other text, and never find a conversation's history (every call ``no_match``).

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

from harnessrl.engines.tiny import tiny_model_dir  # noqa: E402

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
    procs: list[subprocess.Popen[bytes]],
    tree: Path,
    upstream: str,
    tmp: Path,
    key: str,
    *,
    python: str = sys.executable,
    tokenizer: str = "tiny",
) -> str:
    """Start ``tree``'s gateway on ``python`` with the engine's ``tokenizer`` (a folder, or ``tiny``)."""
    port = go.free_port()
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    store = tmp / f"{tree.name}-{port}.db"
    role = [python, str(HERE.parent / "gateway_overhead.py"), "--role", "harnessrl"]
    args = ["--port", str(port), "--upstream", upstream, "--store", str(store), "--admin-key", key]
    procs.append(subprocess.Popen([*role, *args, "--tokenizer", tokenizer], env=env))
    url = f"http://127.0.0.1:{port}"
    go.wait_http(f"{url}/api/health", procs[-1])
    return url


def python_build(python: str) -> dict[str, str]:
    """``python``'s path and ``sys.version`` (builds of one version differ: Debian's is built with PGO)."""
    version = subprocess.run([python, "-c", "import sys; print(sys.version)"], capture_output=True, text=True)
    return {"executable": python, "version": " ".join(version.stdout.split())}


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


async def prompt_reuse(urls: dict[str, str], key: str) -> dict[str, dict[str, float]]:
    """How each side built its prompts (``first``, ``reused``, ``no_match``...): two sides compared on
    different paths (one finding no conversation's history) would measure that, not the change."""
    return {side: await go.gateway_reuse(url, key) for side, url in urls.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="the other checkout (its src/ is imported)")
    ap.add_argument("--legs", type=parse_legs, default=["chat", "stream"])
    ap.add_argument("--concurrency", type=int, choices=[1, 32], default=1)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--conversations", type=int, default=2, help="conversations per batch (x32 at C=32)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--before-python", default=sys.executable, help="the before gateway's interpreter (default: this one)"
    )
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
        tokenizer = str(tiny_model_dir(weights=False))  # the one the bodies and the upstream use
        before = args.before.resolve()
        urls = {
            "before": start_gateway(
                procs, before, upstream, Path(tmp), key, python=args.before_python, tokenizer=tokenizer
            ),
            "after": start_gateway(procs, ROOT, upstream, Path(tmp), key, tokenizer=tokenizer),
        }
        pids = {"before": procs[1].pid, "after": procs[2].pid}
        legs = asyncio.run(compare(urls, pids, key, args.legs, args))
        reuse = asyncio.run(prompt_reuse(urls, key))
    result: dict[str, Any] = {
        "benchmark": "gateway_before_after",
        "before": str(args.before),
        "python": {"before": python_build(args.before_python), "after": python_build(sys.executable)},
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "load_avg_1m": [round(x, 2) for x in os.getloadavg()],
        "legs": legs,
        "prompt_reuse": reuse,
    }
    print(f"prompts built, by how: {reuse}")
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
