"""Collocated async vs synchronous training, end to end, with a long-tail-latency harness.

What is measured: the wall-clock time of ``harnessrl train`` (a subprocess each, same config except
``trainer.mode``) for the same number of optimizer steps in ``mode = "sync"`` and ``mode = "async"``,
run one after the other in this script; ``speedup = sync_seconds / async_seconds``. Both runs use the
``tiny`` model (random Qwen3-architecture weights: fast generation and training steps, so the
harness latency dominates, as it does for real agents whose tools and tests take seconds to minutes).

The harness is this very file run with ``--agent``: a stdlib HTTP agent (like ``examples/tiny``)
that makes two model calls, sleeping before each one for a lognormal time (a "tool" or "test run"),
so a few rollouts take many times the median. The sleeps are drawn from a generator seeded by the
rollout id (``g000012-r3``: group 12, rollout 3), and both modes create the same rollout ids for the
same tasks, so both see exactly the same delays. In sync mode every step waits for the slowest of its
``tasks_per_step * group_size`` rollouts; in async mode up to ``max_in_flight`` rollouts keep running
while the trainer steps, and a step starts as soon as enough *groups* are complete.

Also recorded per mode: the time inside the training loop (sum of ``time/step_s``), rollouts dropped
for staleness (async trains on fewer samples if any are dropped: that is the price of the speedup,
so it is reported next to it) and the final reward.

What it does not show: the speedup on a real model, where training steps take a large share of the
wall time (the pause during a step stalls generation in both modes; async only hides harness
latency); nor any effect of staleness on learning quality.

    .venv/bin/python benchmarks/async_vs_sync.py                 # 8 steps per mode, ~3 min
    .venv/bin/python benchmarks/async_vs_sync.py --steps 4 --median-s 0.5
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "async_vs_sync.json"


# -- the harness ---------------------------------------------------------------------------------------
def delays(rollout_id: str, median_s: float, sigma: float, turns: int, cap_s: float) -> list[float]:
    """Per-turn sleeps of one rollout: lognormal(ln median, sigma), capped, seeded by the rollout id."""
    seed = int.from_bytes(hashlib.sha256(rollout_id.encode()).digest()[:8], "big")
    rng = random.Random(seed)
    return [min(cap_s, rng.lognormvariate(math.log(median_s), sigma)) for _ in range(turns)]


def run_agent(rollout_id: str, prompt: str, median_s: float, sigma: float, turns: int, cap_s: float) -> None:
    """A chat agent whose 'tools' take long-tailed time: sleep, call the model, repeat."""
    messages: list[dict[str, str]] = [{"role": "user", "content": prompt}]
    content = ""
    for turn, delay in enumerate(delays(rollout_id, median_s, sigma, turns, cap_s)):
        time.sleep(delay)
        if turn:
            messages.append({"role": "user", "content": "Again, vowels only."})
        body = {"model": os.environ.get("HARNESSRL_MODEL", "policy"), "messages": messages, "max_tokens": 8}
        request = urllib.request.Request(
            os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
            data=json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(request, timeout=600) as response:
            content = json.load(response)["choices"][0]["message"]["content"] or ""
        messages.append({"role": "assistant", "content": content})
    print(content)


# -- the runs ------------------------------------------------------------------------------------------
CONFIG = """\
[run]
name = "async-vs-sync-{mode}"
dir = "{run_dir}"
seed = 0

[engine]
model = "tiny"

[harness]
preset = "python"
command = [{script}, "--agent", "--median-s", "{median_s}", "--sigma", "{sigma}", "--turns", "{turns}",
           "--cap-s", "{cap_s}", "{{rollout_id}}", "{{prompt}}"]
timeout_s = 300

[evaluator]
type = "python"
function = "harnessrl.tasks.toy:vowel_share"

[tasks]
type = "inline"
items = [{items}]

[controller]
concurrency = {concurrency}

[optimizer]
lr = 1e-2

[trainer]
mode = "{mode}"
steps = {steps}
tasks_per_step = {tasks_per_step}
group_size = {group_size}
max_in_flight = {max_in_flight}
max_staleness = {max_staleness}
stale_samples = "{stale_samples}"
temperature = 1.0
max_tokens = 8

[metrics]
tensorboard = false
progress = false
"""


def write_config(folder: Path, mode: str, args: argparse.Namespace) -> Path:
    items = ", ".join(
        f'{{ task_id = "t{i}", prompt = "Task {i}: reply with vowels only." }}' for i in range(16)
    )
    in_flight = args.max_in_flight or (1 + args.max_staleness) * args.tasks_per_step * args.group_size
    text = CONFIG.format(
        mode=mode,
        run_dir=folder / f"run-{mode}",
        script=json.dumps(str(Path(__file__).resolve())),
        median_s=args.median_s,
        sigma=args.sigma,
        turns=args.turns,
        cap_s=args.cap_s,
        items=items,
        concurrency=max(in_flight, args.tasks_per_step * args.group_size),
        steps=args.steps,
        tasks_per_step=args.tasks_per_step,
        group_size=args.group_size,
        max_in_flight=in_flight,
        max_staleness=args.max_staleness,
        stale_samples=args.stale_samples,
    )
    path = folder / f"{mode}.toml"
    path.write_text(text)
    return path


def run_mode(folder: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    config = write_config(folder, mode, args)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "harnessrl", "train", str(config)],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} run failed:\n{proc.stderr[-4000:]}")
    rows = [json.loads(line) for line in (folder / f"run-{mode}" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("reward/mean") is not None]
    return {
        "seconds": round(seconds, 2),
        "loop_seconds": round(sum(r["time/step_s"] for r in rows), 2),
        "steps": len(rows),
        "rollouts_trained": sum(r["rollouts/total"] - r["rollouts/dropped_stale"] for r in rows),
        "rollouts_dropped_stale": sum(r["rollouts/dropped_stale"] for r in rows),
        "staleness_mean": round(sum(r["staleness/mean"] for r in rows) / max(1, len(rows)), 3),
        "pause_seconds": round(sum(r["time/pause_s"] for r in rows), 2),
        "reward_first": rows[0]["reward/mean"] if rows else None,
        "reward_last": rows[-1]["reward/mean"] if rows else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agent", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--tasks-per-step", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument(
        "--max-in-flight", type=int, default=None, help="default (1 + staleness) steps' worth"
    )
    parser.add_argument("--stale-samples", choices=["drop", "downweight"], default="drop")
    parser.add_argument("--median-s", type=float, default=1.0, help="median sleep per turn")
    parser.add_argument("--sigma", type=float, default=1.0, help="lognormal shape: the tail's weight")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--cap-s", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.agent:
        rollout_id, prompt = args.rest
        run_agent(rollout_id, prompt, args.median_s, args.sigma, args.turns, args.cap_s)
        return

    with tempfile.TemporaryDirectory(prefix="harnessrl-async-bench-") as tmp:
        folder = Path(tmp)
        results = {}
        for mode in ("sync", "async"):
            print(f"running {mode} ({args.steps} steps)...", file=sys.stderr, flush=True)
            results[mode] = run_mode(folder, mode, args)
            print(f"  {mode}: {results[mode]}", file=sys.stderr, flush=True)
    per_rollout = [
        sum(delays(f"g{g:06d}-r{k}", args.median_s, args.sigma, args.turns, args.cap_s))
        for g in range(args.steps * args.tasks_per_step)
        for k in range(args.group_size)
    ]
    per_rollout.sort()
    out = {
        "sync_seconds": results["sync"]["seconds"],
        "async_seconds": results["async"]["seconds"],
        "speedup": round(results["sync"]["seconds"] / results["async"]["seconds"], 3),
        "loop_speedup": round(results["sync"]["loop_seconds"] / results["async"]["loop_seconds"], 3),
        "steps": args.steps,
        "sync": results["sync"],
        "async": results["async"],
        "settings": {
            "model": "tiny",
            "tasks_per_step": args.tasks_per_step,
            "group_size": args.group_size,
            "async_max_in_flight": args.max_in_flight
            or (1 + args.max_staleness) * args.tasks_per_step * args.group_size,
            "max_staleness": args.max_staleness,
            "stale_samples": args.stale_samples,
            "latency": {
                "distribution": "lognormal per turn, seeded by rollout id",
                "median_s": args.median_s,
                "sigma": args.sigma,
                "turns": args.turns,
                "cap_s": args.cap_s,
                "rollout_delay_p50_s": round(per_rollout[len(per_rollout) // 2], 2),
                "rollout_delay_p95_s": round(per_rollout[int(len(per_rollout) * 0.95)], 2),
                "rollout_delay_max_s": round(per_rollout[-1], 2),
            },
        },
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
