"""Learning to search through an unmodified harness: the search_agent example (SmolLM2-135M through
mini-swe-agent's text actions, the retriever as a `search` command) on CPU.

One command runs, all through the same harness, retriever, sandbox and evaluator
(``examples/search_agent``: ``mini_search.yaml``, ``harnessrl.tasks.search:score_search``):

1. the data (``python -m harnessrl.tasks.search``: the fictional encyclopedia, training questions and
   held-out questions about entities no training question touches; ``--hops`` chooses the mix);
2. **base evaluation**: every held-out question once, greedy, through ``harnessrl data calibrate --k 1``
   on ``rollout.toml``;
3. **training**: ``harnessrl train train.toml`` for a wall budget (``--minutes``), checkpoints every
   ``--save-every`` steps; stopped after the budget, its last whole checkpoint kept;
4. **evaluation of each checkpoint** exactly like step 2.

Reported: held-out exact match before/after (and F1), the standard error of the difference
(``sqrt(p1 (1 - p1) / n + p2 (1 - p2) / n)``), searches per rollout before/after (from the store's
``tool_requests``), the training reward curve. Charged: training wall time (model loading included),
not the evaluations.

    .venv/bin/python benchmarks/search_learning.py --minutes 30
    .venv/bin/python benchmarks/search_learning.py --model tiny --steps 1 --heldout 2 --out /tmp/x.json

What it does not show: multi-hop questions (a 135M model on 2 cores learns the one-search skill
here; the GPU config is for the 1-3-hop mix), other harnesses (the MCP face is in the harness
matrix with a scripted policy). The CPU is shared with whatever else runs on the machine.
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
from harness_learning import checkpoints, read_metrics, write_svg

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "search_agent"
RESULTS = ROOT / "benchmarks" / "results" / "search_learning.json"
PICTURE = ROOT / "docs" / "images" / "search_learning.svg"
HARNESSRL = [sys.executable, "-m", "harnessrl"]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def make_data(out: Path, train_n: int, heldout: int, hops: str, seed: int) -> None:
    subprocess.run(
        [sys.executable, "-m", "harnessrl.tasks.search", "--out", str(out), "--train", str(train_n)]
        + ["--heldout", str(heldout), "--hops", hops, "--seed", str(seed)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    # `harnessrl data calibrate` reads SWE-smith-shaped records: the same tasks with instance_id and
    # problem_statement (the question) added.
    rows = [json.loads(line) for line in (out / "heldout.jsonl").read_text().splitlines() if line.strip()]
    with (out / "heldout_records.jsonl").open("w") as f:
        for row in rows:
            f.write(
                json.dumps({**row, "instance_id": row["task_id"], "problem_statement": row["prompt"]}) + "\n"
            )


def searches_per_rollout(run_dir: Path) -> dict[str, float]:
    db = sqlite3.connect(run_dir / "harnessrl.db")
    rollouts = [r for (r,) in db.execute("SELECT rollout_id FROM rollouts WHERE finished_at IS NOT NULL")]
    counts = dict(db.execute("SELECT rollout_id, COUNT(*) FROM tool_requests GROUP BY rollout_id").fetchall())
    calls = dict(db.execute("SELECT rollout_id, COUNT(*) FROM calls GROUP BY rollout_id").fetchall())
    f1s, answered = [], 0
    for (meta,) in db.execute("SELECT metadata FROM rollouts WHERE finished_at IS NOT NULL"):
        evaluation = json.loads(meta or "{}").get("evaluation") or {}
        f1s.append(float(evaluation.get("f1") or 0.0))
        answered += evaluation.get("answer") is not None
    db.close()
    n = max(1, len(rollouts))
    return {
        "searches_per_rollout": round(sum(counts.get(r, 0) for r in rollouts) / n, 3),
        "share_with_a_search": round(sum(1 for r in rollouts if counts.get(r, 0) > 0) / n, 3),
        "calls_per_rollout": round(sum(calls.get(r, 0) for r in rollouts) / n, 3),
        "share_with_an_answer": round(answered / n, 3),  # wrote answer.txt (right or wrong)
        "f1": round(statistics.fmean(f1s), 4) if f1s else 0.0,
    }


def evaluate(model: str, data: Path, work: Path, name: str, overrides: list[str]) -> dict[str, Any]:
    """Every held-out question once, greedy, through the example's rollout config."""
    out = work / f"eval-{name}.jsonl"
    run_dir = work / f"eval-{name}"
    args = '["-c", "./mini_search.yaml", "-c", "model.model_kwargs.temperature=0.0"]'
    argv = [*HARNESSRL, "data", "calibrate", str(data / "heldout_records.jsonl"), str(out)]
    argv += ["--config", str(EXAMPLE / "rollout.toml"), "--k", "1", "--run-dir", str(run_dir)]
    items = [f"engine.model={model}", f"harness.args={args}", f"retrieval.corpus={data / 'corpus.jsonl'}"]
    for item in [*items, *overrides]:
        argv += ["--set", item]
    started = time.monotonic()
    with open(work / f"eval-{name}.log", "w") as logfile:
        subprocess.run(argv, check=True, stdout=logfile, stderr=subprocess.STDOUT)
    records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    passed = {r["instance_id"]: r["calibration"]["passes"] >= 1 for r in records}
    return {
        "em": sum(passed.values()) / len(passed),
        "passed": sum(passed.values()),
        "tasks": len(passed),
        "infra_failures": sum(r["calibration"]["infra_failures"] for r in records),
        **searches_per_rollout(run_dir),
        "minutes": round((time.monotonic() - started) / 60, 2),
        "per_task": passed,
    }


def train(run_dir: Path, overrides: list[str], budget_s: float | None) -> tuple[float, bool]:
    """``harnessrl train`` on the example, stopped ``budget_s`` after it started (as harness_learning)."""
    argv = [*HARNESSRL, "train", str(EXAMPLE / "train.toml"), "--set", f"run.dir={run_dir}"]
    for item in ["metrics.progress=false", *overrides]:
        argv += ["--set", item]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    started, stopped = time.monotonic(), False
    with open(run_dir.parent / "train.log", "w") as logfile:
        proc = subprocess.Popen(
            argv,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        while proc.poll() is None:
            time.sleep(2)
            if budget_s is not None and time.monotonic() - started > budget_s:
                stopped = True
                stop_run(proc, first_wait_s=30)
                break
    if proc.returncode != 0 and not stopped:
        raise RuntimeError(
            f"harnessrl train failed ({proc.returncode}):\n{(run_dir.parent / 'train.log').read_text()[-4000:]}"
        )
    return time.monotonic() - started, stopped


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="training wall budget")
    parser.add_argument("--steps", type=int, default=None, help="stop after this many steps instead")
    parser.add_argument("--save-every", type=int, default=4)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--hops", default="1", help="hop counts of the questions (training and held-out)")
    parser.add_argument("--train-tasks", type=int, default=800)
    parser.add_argument("--heldout", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="train.toml override")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--picture", type=Path, default=None)
    args = parser.parse_args(argv)
    picture = args.picture or (PICTURE if args.out == RESULTS else args.out.with_suffix(".svg"))

    work = args.work or Path(tempfile.mkdtemp(prefix="search-learning-"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / "data"
    make_data(data, args.train_tasks, args.heldout, args.hops, args.seed)
    eval_overrides = [o for o in args.overrides if o.startswith(("engine.", "controller.", "retrieval."))]

    log(f"base evaluation: {args.heldout} held-out questions, greedy")
    before = evaluate(args.model, data, work, "base", eval_overrides)
    log(f"base: EM {before['passed']}/{before['tasks']}, {before['searches_per_rollout']} searches/rollout")

    run_dir = work / "run"
    overrides = [
        f"engine.model={args.model}",
        f"tasks.path={data / 'train.jsonl'}",
        f"heldout.path={data / 'heldout.jsonl'}",
        f"retrieval.corpus={data / 'corpus.jsonl'}",
        f"trainer.steps={args.steps or 100_000}",
        f"trainer.save_every={args.save_every}",
        "trainer.eval_every=0",  # evaluated after the run, from the checkpoints: not charged
        *args.overrides,
    ]
    log(f"training: {f'{args.steps} steps' if args.steps else f'{args.minutes:g} min'}")
    ran_s, stopped = train(run_dir, overrides, None if args.steps else args.minutes * 60)
    rows = read_metrics(run_dir)
    curve = []
    for step, folder in checkpoints(run_dir):
        log(f"evaluating the step-{step} checkpoint")
        result = evaluate(str(folder), data, work, f"step-{step}", eval_overrides)
        row = next((r for r in rows if r.get("step") == step and "time" in r), None)
        curve.append({"step": step, "result": result, "row": row})
    if not curve:
        raise SystemExit(f"no checkpoint in {run_dir}: was the budget shorter than one step?")
    last = curve[-1]
    launched = min((r["time"] for r in rows if "time" in r), default=None)
    first_step = next((r for r in rows if r.get("reward/mean") is not None), None)
    if last["row"] is not None and first_step is not None and launched is not None:
        minutes = (last["row"]["time"] - launched + first_step["time/step_s"]) / 60
    else:
        minutes = ran_s / 60
    after = last["result"]
    n = before["tasks"]
    se = math.sqrt(before["em"] * (1 - before["em"]) / n + after["em"] * (1 - after["em"]) / n)
    gain = after["em"] - before["em"]
    trained = [r for r in rows if r.get("reward/mean") is not None]
    result = {
        "harness": "mini-swe-agent (text actions) + the `search` command",
        "model": {"smollm2": "SmolLM2-135M-Instruct", "tiny": "tiny (random weights)"}.get(
            args.model, args.model
        ),
        "hops": args.hops,
        "heldout_success_before": round(before["em"], 4),  # exact match (write_svg's names)
        "heldout_success_after": round(after["em"], 4),
        "heldout_gain": round(gain, 4),
        "heldout_stderr": round(se, 4),
        "gain_in_stderrs": round(gain / se, 2) if se > 0 else None,
        "heldout_tasks": n,
        "heldout_f1_before": before["f1"],
        "heldout_f1_after": after["f1"],
        "searches_per_rollout_before": before["searches_per_rollout"],
        "searches_per_rollout_after": after["searches_per_rollout"],
        "share_with_a_search_before": before["share_with_a_search"],
        "share_with_a_search_after": after["share_with_a_search"],
        "heldout_flipped": {
            "to_pass": sum(after["per_task"][t] and not p for t, p in before["per_task"].items()),
            "to_fail": sum(p and not after["per_task"][t] for t, p in before["per_task"].items()),
        },
        "heldout_curve": [[c["step"], c["result"]["em"]] for c in curve],
        "searches_curve": [[c["step"], c["result"]["searches_per_rollout"]] for c in curve],
        "steps": last["step"],
        "minutes": round(minutes, 2),
        "stopped_by_budget": stopped,
        "rollouts_per_step": trained[0]["rollouts/total"] if trained else None,
        "train_reward_curve": [[r["step"], round(r["reward/mean"], 3)] for r in trained],
        # the training rollouts (sampled at trainer.temperature): what the policy did while it trained
        "train_rollouts": searches_per_rollout(run_dir),
        "eval_minutes": {c["step"]: c["result"]["minutes"] for c in curve} | {"base": before["minutes"]},
        "eval_infra_failures": before["infra_failures"] + sum(c["result"]["infra_failures"] for c in curve),
        "config": vars(args) | {"work": str(work), "out": str(args.out), "picture": str(picture)},
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_at_end": os.getloadavg(),
        },  # fmt: skip
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "command": "python benchmarks/search_learning.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    write_svg(result, picture)
    keys = ("heldout_success_before", "heldout_success_after", "heldout_stderr", "searches_per_rollout_before",
            "searches_per_rollout_after", "steps", "minutes")  # fmt: skip
    print(json.dumps({k: result[k] for k in keys}))


if __name__ == "__main__":
    main()
