"""The SWE-smith-shaped example's calibration (examples/swe): how often a policy solves its tasks, with
unmodified mini-swe-agent running inside each task's image and the example's scorer in the same image.

Two policies through ``harnessrl data calibrate`` with the example's own training config:

- the scripted **gold-fix** policy (``tasks/gold_fix.json``: applies each task's gold fix, then
  submits). It must solve 100%: every task is solvable in its image and the scorer gives the fix 1.
- **SmolLM2-135M-Instruct** (the CPU model of ``train.toml``), every call capped at
  ``--max-tokens``, k rollouts per task.

    .venv/bin/python examples/swe/make_tasks.py --out examples/swe/tasks
    .venv/bin/python benchmarks/swe_calibration.py --k 1            # ~20-40 min on 2 cores

Writes ``benchmarks/results/swe_calibration.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "swe"


def calibrate(tasks: Path, out: Path, k: int, sets: list[str]) -> tuple[dict, float]:
    argv = [sys.executable, "-m", "harnessrl", "data", "calibrate", str(tasks), str(out)]
    argv += [
        "--config",
        str(EXAMPLE / "train.toml"),
        "--k",
        str(k),
        "--run-dir",
        str(out.parent / f"{out.stem}-run"),
    ]
    for item in sets:
        argv += ["--set", item]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1]), time.monotonic() - started


def summary(report: dict, out: Path, seconds: float) -> dict:
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    rewards = [r for row in rows for r in row["calibration"]["rewards"]]
    return {
        "tasks": report["input"],
        "rollouts": len(rewards),
        "solve_rate": round(sum(r >= 1 for r in rewards) / len(rewards), 4) if rewards else None,
        "tasks_solved_at_least_once": sum(row["calibration"]["passes"] > 0 for row in rows),
        "infra_failures": sum(row["calibration"]["infra_failures"] for row in rows),
        "flagged_rollouts": report["flagged_rollouts"],
        "seconds": round(seconds, 1),
        "seconds_per_rollout": round(seconds / max(1, len(rewards)), 1),
        "per_project": {
            project: sum(row["calibration"]["passes"] for row in rows if row["source"]["project"] == project)
            for project in sorted({row["source"]["project"] for row in rows})
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=Path, default=EXAMPLE / "tasks" / "tasks.jsonl")
    parser.add_argument("--k", type=int, default=1, help="SmolLM2 rollouts per task")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--skip-model", action="store_true", help="only the gold-fix control")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "swe_calibration.json"))
    args = parser.parse_args()
    gold_script = args.tasks.parent / "gold_fix.json"
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="harnessrl-bench-swe-") as tmp:
        out = Path(tmp) / "gold.jsonl"
        report, seconds = calibrate(args.tasks, out, 1, [f"engine.model=scripted:{gold_script}"])
        results["gold_fix"] = summary(report, out, seconds)
        print("gold_fix", json.dumps(results["gold_fix"]))
        if not args.skip_model:
            out = Path(tmp) / "smollm2.jsonl"
            sets = ["engine.model=smollm2", f"gateway.max_tokens={args.max_tokens}"]
            report, seconds = calibrate(args.tasks, out, args.k, sets)
            results["smollm2"] = {**summary(report, out, seconds), "k": args.k, "max_tokens": args.max_tokens}
            print("smollm2", json.dumps(results["smollm2"]))
    payload = {
        "benchmark": "swe_calibration",
        "results": results,
        "harness": "mini-swe-agent (step_limit 8), each task in its repository's image",
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cores": 2},
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    Path(args.out).write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
