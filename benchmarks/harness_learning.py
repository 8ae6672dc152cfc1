"""Learning through an unmodified third-party harness: mini-swe-agent on the shell_agent example.

One command runs, all through the same harness (mini-swe-agent from PyPI, configured only by
``examples/shell_agent/mini_shell.yaml`` and flags), the same sandbox and the same evaluator
(``examples/shell_agent/check.py``):

1. the example's tasks (``make_tasks.py``: training tasks and a held-out split sharing no instance);
2. **base evaluation**: every held-out task once, greedy (temperature 0), through
   ``harnessrl data calibrate --k 1`` on ``rollout.toml``;
3. **training**: ``harnessrl train train.toml`` for a fixed wall budget (``--minutes``), numbered
   checkpoints every ``--save-every`` steps; stopped after the budget, its last whole checkpoint kept;
4. **evaluation of each checkpoint** (the intermediate ones and the last) exactly like step 2.

Charged: the training run's wall time from its start to the metrics row of the evaluated step
(model loading included; the evaluations are not charged, they run after the training run).
``heldout_stderr`` is the standard error of the difference of two success rates on the held-out
tasks (``sqrt(p1 (1 - p1) / n + p2 (1 - p2) / n)``); ``gain_in_stderrs`` is the gain divided by it.
``step_time_s`` breaks the mean training step down: from the store, the harness's own time per rollout
(sandbox start to harness exit, minus the model calls), the model calls' time, the evaluator's time,
and from the trainer's metrics the optimizer step and checkpoint wait.

    .venv/bin/python benchmarks/harness_learning.py --minutes 30     # ~50 min in all on 2 cores
    .venv/bin/python benchmarks/harness_learning.py --model tiny --steps 2 --heldout 2 --out /tmp/x.json

What it does not show: other harnesses (the other presets are driven by a scripted policy in the
harness-matrix tests), other task mixes, or results at other scales. The CPU is shared with whatever
else runs on the machine; wall times move with it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cpu_example import stop_run  # benchmarks/ is on sys.path: these scripts run as files

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "shell_agent"
RESULTS = ROOT / "benchmarks" / "results" / "harness_learning.json"
PICTURE = ROOT / "docs" / "images" / "harness_learning.svg"
HARNESSRL = [sys.executable, "-m", "harnessrl"]
MODEL_NAMES = {"smollm2": "SmolLM2-135M-Instruct", "tiny": "tiny (random weights)"}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def make_tasks(out: Path, train: int, heldout: int, seed: int) -> None:
    subprocess.run(
        [sys.executable, str(EXAMPLE / "make_tasks.py"), "--out", str(out)]
        + ["--train", str(train), "--heldout", str(heldout), "--seed", str(seed)],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def evaluate(model: str, tasks: Path, work: Path, name: str, overrides: list[str]) -> dict[str, Any]:
    """Every task of ``tasks`` once, greedy, through the example's rollout config; the successes."""
    out = work / f"eval-{name}.jsonl"
    run_dir = work / f"eval-{name}"
    args = '["-c", "./mini_shell.yaml", "-c", "model.model_kwargs.temperature=0.0"]'
    argv = [*HARNESSRL, "data", "calibrate", str(tasks), str(out), "--config", str(EXAMPLE / "rollout.toml")]
    argv += ["--k", "1", "--run-dir", str(run_dir)]
    for item in [f"engine.model={model}", f"harness.args={args}", *overrides]:
        argv += ["--set", item]
    started = time.monotonic()
    with open(work / f"eval-{name}.log", "w") as logfile:
        subprocess.run(argv, check=True, stdout=logfile, stderr=subprocess.STDOUT)
    records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    passed = {r["instance_id"]: r["calibration"]["passes"] >= 1 for r in records}
    infra = sum(r["calibration"]["infra_failures"] for r in records)
    families: dict[str, list[bool]] = {}
    for r in records:
        families.setdefault(r.get("family", "?"), []).append(passed[r["instance_id"]])
    return {
        "success": sum(passed.values()) / len(passed),
        "passed": sum(passed.values()),
        "tasks": len(passed),
        "infra_failures": infra,
        "by_family": {f: round(sum(v) / len(v), 3) for f, v in sorted(families.items())},
        "minutes": round((time.monotonic() - started) / 60, 2),
        "per_task": passed,
    }


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train(run_dir: Path, overrides: list[str], budget_s: float | None) -> tuple[float, bool]:
    """``harnessrl train`` on the example, stopped (SIGINT, then harder) ``budget_s`` after it started.
    Returns (seconds it ran, whether the budget stopped it)."""
    argv = [*HARNESSRL, "train", str(EXAMPLE / "train.toml"), "--set", f"run.dir={run_dir}"]
    for item in ["metrics.progress=false", *overrides]:
        argv += ["--set", item]
    started = time.monotonic()
    stopped = False
    with open(run_dir.parent / "train.log", "w") as logfile:
        proc = subprocess.Popen(
            argv,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Started in the background, a benchmark inherits SIGINT as ignored: give it back to the run.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        while proc.poll() is None:
            time.sleep(2)
            if budget_s is not None and time.monotonic() - started > budget_s:
                stopped = True
                stop_run(proc, first_wait_s=30)
                break
    if proc.returncode != 0 and not stopped:
        tail = (run_dir.parent / "train.log").read_text()[-4000:]
        raise RuntimeError(f"harnessrl train failed ({proc.returncode}):\n{tail}")
    return time.monotonic() - started, stopped


def checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every whole checkpoint of the run: the numbered ones and the latest."""
    from harnessrl.trainer.checkpoint import latest_checkpoint

    found: dict[int, Path] = {}
    folders = sorted((run_dir / "checkpoints").glob("step-*"))
    latest = latest_checkpoint(run_dir)
    for folder in [*folders, *([latest] if latest else [])]:
        state = folder / "harnessrl_state.json"
        if state.exists():
            found.setdefault(json.loads(state.read_text())["step"], folder)
    return sorted(found.items())


def step_breakdown(run_dir: Path, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Where a training step's time goes, per rollout from the store and per step from the metrics."""
    db = sqlite3.connect(run_dir / "harnessrl.db")
    per_rollout: list[tuple[float, float, float, int]] = []
    # Every finished rollout of the run's store: with trainer.eval_every = 0 they are all training rollouts.
    for rid, metadata in db.execute(
        "SELECT rollout_id, metadata FROM rollouts WHERE finished_at IS NOT NULL"
    ):
        meta = json.loads(metadata or "{}")
        calls = db.execute(
            "SELECT started_at, finished_at FROM calls WHERE rollout_id = ? AND finished_at IS NOT NULL",
            (rid,),
        ).fetchall()
        model_s = sum(f - s for s, f in calls)
        harness_s = float(meta.get("harness_seconds") or 0.0)
        evaluation_s = float((meta.get("evaluation") or {}).get("seconds") or 0.0)
        per_rollout.append((harness_s - model_s, model_s, evaluation_s, len(calls)))
    db.close()
    trained = [r for r in rows if r.get("reward/mean") is not None]

    def mean(values: list[float]) -> float | None:
        return round(statistics.fmean(values), 2) if values else None

    return {
        "rollouts": len(per_rollout),
        "harness_and_tools_s_per_rollout": mean([p[0] for p in per_rollout]),
        "model_calls_s_per_rollout": mean([p[1] for p in per_rollout]),
        "evaluation_s_per_rollout": mean([p[2] for p in per_rollout]),
        "calls_per_rollout": mean([float(p[3]) for p in per_rollout]),
        "step_s": mean([r["time/step_s"] for r in trained]),
        "optimizer_s": mean([r["time/train_s"] for r in trained]),
        "checkpoint_wait_s": mean([r.get("time/checkpoint_wait_s", 0.0) for r in trained]),
        "pause_s": mean([r.get("time/pause_s", 0.0) for r in trained]),
        "note": "rollouts run concurrently (controller.concurrency) and overlap the optimizer step "
        "(async mode): per-rollout times are wall seconds of each rollout, not shares of a step",
    }


def stderr_of_difference(p1: float, p2: float, n: int) -> float:
    return math.sqrt(p1 * (1 - p1) / n + p2 * (1 - p2) / n)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="training wall budget")
    parser.add_argument("--steps", type=int, default=None, help="stop after this many steps instead")
    parser.add_argument("--save-every", type=int, default=5, help="steps between evaluated checkpoints")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--train-tasks", type=int, default=400)
    parser.add_argument("--heldout", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="train.toml override")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp folder)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--picture", type=Path, default=None, help=f"the curve as SVG (default with --out: {PICTURE})"
    )
    parser.add_argument("--picture-only", action="store_true", help="redraw the picture from --out's JSON")
    args = parser.parse_args(argv)
    picture = args.picture or (PICTURE if args.out == RESULTS else args.out.with_suffix(".svg"))
    if args.picture_only:
        write_svg(json.loads(args.out.read_text()), picture)
        return

    work = args.work or Path(tempfile.mkdtemp(prefix="harness-learning-"))
    work.mkdir(parents=True, exist_ok=True)
    tasks = work / "tasks"
    make_tasks(tasks, args.train_tasks, args.heldout, args.seed)
    heldout = tasks / "heldout.jsonl"
    eval_overrides = [o for o in args.overrides if o.startswith(("engine.", "controller."))]

    log(f"base evaluation: {args.heldout} held-out tasks, greedy")
    before = evaluate(args.model, heldout, work, "base", eval_overrides)
    log(f"base: {before['passed']}/{before['tasks']} ({before['minutes']} min)")

    run_dir = work / "run"
    overrides = [
        f"engine.model={args.model}",
        f"tasks.path={tasks / 'train.jsonl'}",
        f"heldout.path={heldout}",
        f"trainer.steps={args.steps or 100_000}",
        f"trainer.save_every={args.save_every}",
        "trainer.eval_every=0",  # evaluated after the run, from the checkpoints: not charged
        *args.overrides,
    ]
    budget_s = None if args.steps else args.minutes * 60
    log(f"training: {f'{args.steps} steps' if args.steps else f'{args.minutes:g} min'}")
    ran_s, stopped = train(run_dir, overrides, budget_s)
    rows = read_metrics(run_dir)
    launched = min((r["time"] for r in rows if "time" in r), default=None)
    curve = []
    for step, folder in checkpoints(run_dir):
        log(f"evaluating the step-{step} checkpoint")
        result = evaluate(str(folder), heldout, work, f"step-{step}", eval_overrides)
        row = next((r for r in rows if r.get("step") == step and "time" in r), None)
        curve.append({"step": step, "success": result["success"], "result": result, "row": row})
    if not curve:
        raise SystemExit(f"no checkpoint in {run_dir}: was the budget shorter than one step?")
    last = curve[-1]
    # Charged: launch to the evaluated step's row (step rows carry a wall-clock "time"); the first row
    # is written after the first step, so its own step time is added back.
    first_step = next((r for r in rows if r.get("reward/mean") is not None), None)
    if last["row"] is not None and first_step is not None and launched is not None:
        minutes = (last["row"]["time"] - launched + first_step["time/step_s"]) / 60
    else:
        minutes = ran_s / 60
    after = last["result"]
    n = before["tasks"]
    se = stderr_of_difference(before["success"], after["success"], n)
    gain = after["success"] - before["success"]
    trained = [r for r in rows if r.get("reward/mean") is not None]
    breakdown = step_breakdown(run_dir, rows)
    result = {
        "harness": "mini-swe-agent " + _version("mini-swe-agent"),
        "model": MODEL_NAMES.get(args.model, args.model),
        "heldout_success_before": round(before["success"], 4),
        "heldout_success_after": round(after["success"], 4),
        "heldout_gain": round(gain, 4),
        "heldout_stderr": round(se, 4),
        "gain_in_stderrs": round(gain / se, 2) if se > 0 else None,
        "heldout_tasks": n,
        "heldout_by_family_before": before["by_family"],
        "heldout_by_family_after": after["by_family"],
        "heldout_flipped": {
            "to_pass": sum(after["per_task"][t] and not p for t, p in before["per_task"].items()),
            "to_fail": sum(p and not after["per_task"][t] for t, p in before["per_task"].items()),
        },
        "heldout_curve": [[c["step"], c["success"]] for c in curve],
        "steps": last["step"],
        "minutes": round(minutes, 2),
        "stopped_by_budget": stopped,
        "rollouts_per_step": trained[0]["rollouts/total"] if trained else None,
        "samples_per_rollout": round(
            statistics.fmean(r["trajectory/samples_per_rollout"] for r in trained), 3
        )
        if trained
        else None,
        "calls_per_rollout": breakdown["calls_per_rollout"],
        "train_reward_curve": [[r["step"], round(r["reward/mean"], 3)] for r in trained],
        "step_time_s": breakdown,
        "eval_minutes": {c["step"]: c["result"]["minutes"] for c in curve} | {"base": before["minutes"]},
        "eval_infra_failures": before["infra_failures"] + sum(c["result"]["infra_failures"] for c in curve),
        "config": {
            "minutes": args.minutes,
            "steps": args.steps,
            "save_every": args.save_every,
            "overrides": args.overrides,
            "train_tasks": args.train_tasks,
            "seed": args.seed,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "command": "python benchmarks/harness_learning.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    write_svg(result, picture)
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "heldout_success_before",
                    "heldout_success_after",
                    "gain_in_stderrs",
                    "steps",
                    "minutes",
                )
            }
        )
    )


def write_svg(result: dict[str, Any], path: Path) -> None:
    """The held-out curve as a small SVG (no plotting library needed): success against training step,
    the base evaluation at step 0, with the two-standard-error band of the base rate."""
    curve = [[0, result["heldout_success_before"]], *result["heldout_curve"]]
    width, height, pad = 480, 260, 44
    max_step = max(1, max(s for s, _ in curve))

    def xy(step: float, value: float) -> tuple[float, float]:
        return pad + (width - 2 * pad) * step / max_step, height - pad - (height - 2 * pad) * value

    base, se = result["heldout_success_before"], result["heldout_stderr"]
    lo, hi = xy(0, min(1.0, base + 2 * se))[1], xy(0, max(0.0, base - 2 * se))[1]
    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(s, v) for s, v in curve))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<rect x="{pad}" y="{lo:.1f}" width="{width - 2 * pad}" height="{hi - lo:.1f}" fill="#dde6f5"/>',
    ]
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        _, y = xy(0, tick)
        parts.append(f'<line x1="{pad}" y1="{y:.1f}" x2="{width - pad}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{pad - 6}" y="{y + 4:.1f}" text-anchor="end">{tick:.2f}</text>')
    for step, value in curve:
        x, y = xy(step, value)
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="#2b5fb4"/>')
        parts.append(f'<text x="{x:.1f}" y="{height - pad + 16}" text-anchor="middle">{step}</text>')
        parts.append(f'<text x="{x:.1f}" y="{y - 8:.1f}" text-anchor="middle">{value:.2f}</text>')
    parts += [
        f'<polyline points="{points}" fill="none" stroke="#2b5fb4" stroke-width="2"/>',
        f'<text x="{width / 2}" y="{height - 8}" text-anchor="middle">training step '
        f"({result['minutes']:.0f} min of training on {result['machine']['cpus']} CPU cores)</text>",
        f'<text x="{width / 2}" y="18" text-anchor="middle">held-out success, {result["heldout_tasks"]} tasks, '
        f"greedy ({result['harness']}, {result['model']})</text>",
        f'<text x="{pad + 4}" y="{hi - 4:.1f}" fill="#557">base ± 2 s.e.</text>',
        "</svg>",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts) + "\n")


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    main()
