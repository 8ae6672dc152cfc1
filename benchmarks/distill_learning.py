"""Teacher → SFT → RL through an unmodified harness: Hermes Agent on the assistant example (issue 42,
part 3), or mini-swe-agent on the search agent (``--example search_agent``, issue 44), with held-out
success of the base model, after SFT and after RL.

One command runs, all through the same harness (Hermes Agent's ``hermes -z`` with its file tools,
the ``hermes`` preset), the same sandbox and the same scorer (``examples/assistant/check.py``):

1. **teacher**: ``examples/assistant/expert.py`` started on 127.0.0.1 — a *scripted expert*, not a
   model: it parses each task's prompt and answers with the right ``write_file`` calls — and
   ``harnessrl data calibrate --k 1`` with ``teacher.toml`` (the gateway's teacher mode) records one
   rollout per training task into a store;
2. **SFT**: ``harnessrl sft examples/assistant/sft.toml`` on that store (rollouts with reward 1, the
   student SmolLM2-135M-Instruct, rendered with its template and the file tools), a checkpoint;
3. **RL**: ``harnessrl train examples/assistant/train.toml --set engine.model=<the SFT checkpoint>``;
   with ``--rl-select N``, only on the tasks the SFT model solves sometimes: N training tasks the
   teacher did not record, each ``--rl-select-k`` times through ``data calibrate`` with train.toml
   (sampled as RL samples), kept by ``data select`` (0 < passes < k) — a task the SFT model always
   solves gives a group no reward variance, so nothing to learn from; the stage (``rl_tasks``) counts
   towards SFT + RL's time;
4. **held-out evaluation** of the base model, the SFT checkpoint and the RL checkpoint: every
   held-out task once through ``train.toml``'s harness and evaluator, sampled as the trainer's own
   held-out evaluation samples (``eval_sampling``: ``trainer.eval_temperature`` = 0, greedy, and
   ``trainer.max_tokens``), on the same stack ``harnessrl rollout`` and ``data calibrate`` use. A task
   counts as solved at reward 1 (every constraint met).

Success is a share of n held-out tasks, SE = sqrt(p (1 - p) / n); a gain adds the two variances (the
tasks are the same at each stage, so this overstates the SE of the paired difference). Each stage
records its wall time, the CPU seconds of its processes (``RUSAGE_CHILDREN``) and the load average
before and after (the machine is shared).

    .venv/bin/python benchmarks/distill_learning.py --rl-set trainer.gradient_checkpointing=true \
        --rl-set algorithm.zero_variance_groups=drop [--sampled-evals 4]   # full size: ~40 (60) min here
    .venv/bin/python benchmarks/distill_learning.py --example search_agent # full size: ~28 min here
    .venv/bin/python benchmarks/distill_learning.py --smoke                # ~the pipeline end to end, tiny

**The search agent** (``--example search_agent``; examples/search_agent/README.md, "Distill, then
RL"): the same stages through mini-swe-agent's text actions and the ``search`` command, on the
one-search questions (``data/train_1hop.jsonl``, held-out ``data/heldout_1hop.jsonl``): the teacher is
``examples/search_agent/expert.py`` (a scripted expert: it searches the question and writes the
passage's answer to answer.txt), the scorer ``score_search`` (exact match, reward 1 = solved), the
stack ``examples/search_agent/{teacher,sft,train}.toml``. Its own sizes (``SIZES``) and result files
(``distill_learning_search_agent[_smoke].json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import load_average  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HARNESSRL = [sys.executable, "-m", "harnessrl"]


class Example(NamedTuple):
    """What differs between the examples this runs: files, the task field held-out success is broken
    down by, the words the result describes the run with, and the result file's name."""

    folder: Path
    train_tasks: str  # relative to the folder
    heldout_tasks: str
    group_by: str  # written as "family" in an evaluation's rewards.json
    harness: str
    teacher: str
    results: str  # benchmarks/results/<results>[_smoke].json


EXAMPLES = {
    "assistant": Example(
        ROOT / "examples" / "assistant", "tasks/train.jsonl", "tasks/heldout.jsonl", "family",
        harness="Hermes Agent (hermes -z, -t file), the hermes preset",
        teacher="examples/assistant/expert.py: a scripted expert (parses the prompt, answers with "
        "the right write_file calls), not a model, behind the gateway's teacher mode",
        results="distill_learning",
    ),
    "search_agent": Example(
        ROOT / "examples" / "search_agent", "data/train_1hop.jsonl", "data/heldout_1hop.jsonl", "hops",
        harness="mini-swe-agent (text actions, mini_search.yaml) + the `search` command, the "
        "mini-swe-agent preset",
        teacher="examples/search_agent/expert.py: a scripted expert (searches the question, writes the "
        "answer the returned passage states to answer.txt), not a model, behind the gateway's teacher mode",
        results="distill_learning_search_agent",
    ),
}  # fmt: skip
# The full run's sizes per example (flags override them). The search agent's sequences are ~335
# SmolLM2 tokens (mini_search.yaml's prompt, two short actions; ~170 shared by a step's sequences),
# not Hermes's ~3k: its 24 SFT steps are cheap, and RL's rollouts (a mini-swe-agent start each, 24 a
# step) are what the time goes to (~5.5 min a step measured by search_learning at load 10-14).
SIZES = {
    "assistant": {
        "teacher_tasks": 48, "heldout": 40, "sft_epochs": 2, "sft_sequences_per_step": 8,
        "rl_steps": 12, "rl_tasks_per_step": 2, "rl_group_size": 4, "rl_select": 40,
    },
    "search_agent": {
        "teacher_tasks": 96, "heldout": 40, "sft_epochs": 2, "sft_sequences_per_step": 8,
        "rl_steps": 4, "rl_tasks_per_step": 4, "rl_group_size": 6, "rl_select": 0,
    },
}  # fmt: skip
# The smoke run: the pipeline end to end at the smallest size that exercises every stage.
SMOKE = {
    "teacher_tasks": 4, "heldout": 4, "sft_epochs": 1, "sft_sequences_per_step": 2,
    "rl_steps": 1, "rl_tasks_per_step": 1, "rl_group_size": 2, "rl_select": 0,
}  # fmt: skip


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def records(tasks: list[dict[str, Any]], group_by: str = "family") -> list[dict[str, Any]]:
    """The example's tasks as ``data calibrate`` records (``instance_id``, ``problem_statement``)."""
    return [
        {
            "instance_id": t["task_id"],
            "problem_statement": t["prompt"],
            group_by: t[group_by],
            "hidden": t["hidden"],
        }
        for t in tasks
    ]


class Stage:
    """Wall time, CPU seconds of the child processes waited for, and load average around a stage."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> Stage:
        log(f"{self.name}: start (load {load_average()})")
        self.started, self.cpu = time.monotonic(), self._children_cpu()
        self.load_before = load_average()
        return self

    def __exit__(self, *exc: object) -> None:
        self.report = {
            "wall_s": round(time.monotonic() - self.started, 1),
            "cpu_s": round(self._children_cpu() - self.cpu, 1),
            "load_before": self.load_before,
            "load_after": load_average(),
        }
        log(f"{self.name}: {self.report}")

    @staticmethod
    def _children_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime


def run(argv: list[str], logfile: Path) -> None:
    with open(logfile, "w") as out:
        proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv[2:5])} failed ({proc.returncode}):\n{logfile.read_text()[-3000:]}"
        )


def with_sets(argv: list[str], sets: list[str], flag: str = "--set") -> list[str]:
    for item in sets:
        argv += [flag, item]
    return argv


# -- stages ----------------------------------------------------------------------------------------
def record_teacher(example: Example, tasks: list[dict[str, Any]], work: Path) -> dict[str, Any]:
    """The expert behind the gateway's teacher mode, one rollout per task; what was recorded."""
    given = records(tasks, example.group_by)
    (work / "teacher-tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in given))
    expert = subprocess.Popen(
        [sys.executable, str(example.folder / "expert.py"), "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        url = expert.stdout.readline().split()[-1]  # "expert: serving http://127.0.0.1:PORT/v1"
        argv = [
            *HARNESSRL,
            "data",
            "calibrate",
            str(work / "teacher-tasks.jsonl"),
            str(work / "teacher.jsonl"),
        ]
        argv += ["--config", str(example.folder / "teacher.toml"), "--k", "1"]
        argv += ["--run-dir", str(work / "teacher")]
        sets = [f"engine.teacher.base_url={url}"]
        run(with_sets(argv, sets), work / "teacher.log")
    finally:
        expert.terminate()
        expert.wait(timeout=30)
    rewards = [r["calibration"]["rewards"][0] for r in read_jsonl(work / "teacher.jsonl")]
    return {"rollouts": len(rewards), "solved": sum(r >= 1.0 for r in rewards), "mean_reward": mean(rewards)}


def sft(
    example: Example, work: Path, epochs: int, sequences_per_step: int, sets: list[str]
) -> dict[str, Any]:
    argv = [*HARNESSRL, "sft", str(example.folder / "sft.toml")]
    sets = [f"source.run_dir={work / 'teacher'}", f"run.dir={work / 'sft'}", f"sft.epochs={epochs}",
            f"sft.sequences_per_step={sequences_per_step}", *sets]  # fmt: skip
    run(with_sets(argv, sets), work / "sft.log")
    data = json.loads((work / "sft" / "sft_data.json").read_text())
    rows = read_jsonl(work / "sft" / "metrics.jsonl")
    losses = [r["sft/loss"] for r in rows if "sft/loss" in r]
    return {
        "rollouts_selected": data["rollouts_selected"],
        "rollouts_dropped": data["rollouts_dropped"],
        "calls_rendered": data["calls_rendered"],
        "calls_skipped": data["calls_skipped"],
        "sequences": data["sequences"],
        "answer_tokens": data["answer_tokens"],
        "tokens": data["tokens"],
        "steps": len(rows),
        "loss_first": round(losses[0], 4) if losses else None,
        "loss_last": round(losses[-1], 4) if losses else None,
        "checkpoint": str(work / "sft" / "checkpoints" / "final"),
    }


def select_rl_tasks(
    example: Example, candidates: list[dict[str, Any]], work: Path, model: str, k: int, sets: list[str]
) -> dict[str, Any]:
    """The tasks RL trains on: each candidate ``k`` times with the SFT model, sampled as RL samples
    (``data calibrate`` with train.toml: its [trainer] temperature and max_tokens), then ``data
    select`` keeps the ones it solves sometimes (0 < passes < k). Only those can give a group reward
    variance: a task the SFT model always solves gives RL nothing to learn from."""
    given = work / "rl-candidates.jsonl"
    given.write_text("".join(json.dumps(r) + "\n" for r in records(candidates, example.group_by)))
    calibrated, selected = work / "rl-calibrated.jsonl", work / "rl-selected.jsonl"
    argv = [*HARNESSRL, "data", "calibrate", str(given), str(calibrated)]
    argv += ["--config", str(example.folder / "train.toml"), "--k", str(k)]
    argv += ["--run-dir", str(work / "rl-calibrate")]
    run(with_sets(argv, [f"engine.model={model}", *sets]), work / "rl-calibrate.log")
    run([*HARNESSRL, "data", "select", str(calibrated), str(selected)], work / "rl-select.log")
    chosen = {r["instance_id"] for r in read_jsonl(selected)}
    if not chosen:
        raise RuntimeError(f"no candidate task had mixed outcomes over {k} rollouts: RL has nothing to learn")
    tasks = [t for t in candidates if t["task_id"] in chosen]
    (work / "rl-tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    passes = [r["calibration"]["passes"] for r in read_jsonl(calibrated)]
    families: dict[str, int] = {}
    for task in tasks:
        families[task[example.group_by]] = families.get(task[example.group_by], 0) + 1
    return {
        "candidates": len(candidates),
        "k": k,
        "rollouts": len(candidates) * k,
        "mixed": len(tasks),
        "never_solved": passes.count(0),
        "always_solved": passes.count(k),
        "pass_rate": mean([p / k for p in passes]),
        "mixed_by_family": dict(sorted(families.items())),
        "tasks_file": str(work / "rl-tasks.jsonl"),
    }


def rl(
    example: Example,
    work: Path,
    model: str,
    steps: int,
    tasks_per_step: int,
    group_size: int,
    sets: list[str],
) -> dict[str, Any]:
    from harnessrl.trainer.checkpoint import latest_checkpoint

    argv = [*HARNESSRL, "train", str(example.folder / "train.toml")]
    sets = [f"run.dir={work / 'rl'}", f"engine.model={model}", f"trainer.steps={steps}",
            f"trainer.tasks_per_step={tasks_per_step}", f"trainer.group_size={group_size}",
            "trainer.eval_every=0", "metrics.progress=false", "metrics.tensorboard=false", *sets]  # fmt: skip
    run(with_sets(argv, sets), work / "rl.log")
    rows = [r for r in read_jsonl(work / "rl" / "metrics.jsonl") if "reward/mean" in r]
    final = work / "rl" / "checkpoints" / "final"  # what train writes at its last step
    checkpoint = final if final.is_dir() else latest_checkpoint(work / "rl")
    return {
        "steps": len(rows),
        "rollouts": sum(r["rollouts/total"] for r in rows),
        "reward_curve": [[r["step"], round(r["reward/mean"], 3)] for r in rows],
        "loss_tokens": sum(r.get("policy/loss_tokens", 0) for r in rows),
        "checkpoint": str(checkpoint) if checkpoint else None,
    }


def evaluate(
    example: str, model: str, tasks_file: Path, run_dir: Path, logfile: Path, sets: list[str], samples: int
) -> dict[str, Any]:
    """Every held-out task ``samples`` times (greedy unless ``sets`` says otherwise), in a process of
    its own (``--evaluate``); the successes. ``success`` is the share of rollouts solved; its SE is
    that of the per-task success rates (a task's samples are not independent of each other)."""
    argv = [sys.executable, __file__, "--evaluate", model, "--tasks", str(tasks_file), "--work", str(run_dir)]
    argv += ["--example", example, "--eval-samples", str(samples)]
    run(with_sets(argv, sets, "--eval-set"), logfile)  # the internal run reads this script's flag
    return evaluation_report(run_dir, samples)


def evaluation_report(run_dir: Path, samples: int) -> dict[str, Any]:
    """What an evaluation's ``rewards.json`` says: success, its SE, solved, per family..."""
    rewards = json.loads((run_dir / "rewards.json").read_text())
    solved = [r["reward"] >= 1.0 for r in rewards]
    rates = list(task_success(rewards).values())
    n = len(rates)
    p = sum(rates) / n
    families: dict[str, list[bool]] = {}
    for r, ok in zip(rewards, solved, strict=True):
        families.setdefault(r["family"], []).append(ok)
    return {
        "success": round(p, 3),
        # one sample a task: sqrt(p (1 - p) / n), the binomial SE
        "se": round(math.sqrt(sum((x - p) ** 2 for x in rates) / n / n), 3),
        "solved": sum(solved),
        "tasks": n,
        "samples_per_task": samples,
        "mean_reward": mean([r["reward"] for r in rewards]),
        "infra_failures": sum(r["outcome"] in ("infra_failure", "failed", "cancelled") for r in rewards),
        "by_family": {f: round(sum(v) / len(v), 3) for f, v in sorted(families.items())},
        # the retriever's searches (the search agent's `search` command); 0 where a harness has none
        "tool_requests_per_rollout": mean([r.get("tool_requests", 0) for r in rewards]),
    }


async def evaluate_in_process(
    example: Example, model: str, tasks_file: Path, run_dir: Path, sets: list[str], samples: int
) -> None:
    """The held-out evaluation itself: ``train.toml``'s stack and the trainer's held-out sampling,
    each task ``samples`` times."""
    from harnessrl.cli.rollout import TRAIN_ONLY_SECTIONS, load_rollout_config
    from harnessrl.config import load_raw_config, resolve_relative_paths, validate_config
    from harnessrl.controller.stack import local_stack
    from harnessrl.trainer.config import TrainConfig
    from harnessrl.trainer.schedule import eval_sampling

    config_path = example.folder / "train.toml"
    overrides = [f"engine.model={model}", *sets]
    raw = resolve_relative_paths(load_raw_config(config_path, overrides), example.folder)
    sampling = eval_sampling(validate_config(TrainConfig, raw).trainer)
    config = load_rollout_config(str(config_path), overrides, ignore=TRAIN_ONLY_SECTIONS)
    tasks = [task for task in read_jsonl(tasks_file) for _ in range(samples)]
    limit = config.harness.timeout_s * (config.controller.max_infra_retries + 1) + 300
    async with local_stack(config, run_dir) as stack:
        ids = [
            stack.create_rollout(
                task, rollout_id=f"eval-{i // samples:04d}-{i % samples}", task_id=task["task_id"],
                metadata={"sampling": sampling.as_metadata()},
            ).rollout_id
            for i, task in enumerate(tasks)
        ]  # fmt: skip
        done = {r.rollout_id: r for r in await stack.controller.run_until_done(ids, limit)}
        tool_requests = {rid: len(stack.store.list_tool_requests(rid)) for rid in ids}  # searches
    rewards = [
        {
            "task_id": task["task_id"],
            "family": task[example.group_by],
            "reward": float(done[rid].reward or 0.0),
            "outcome": done[rid].outcome.value if done[rid].outcome else done[rid].status.value,
            "tool_requests": tool_requests[rid],
        }
        for rid, task in zip(ids, tasks, strict=True)
    ]
    (run_dir / "rewards.json").write_text(json.dumps(rewards, indent=1) + "\n")


def mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 3) if values else None


def gain(after: dict[str, Any], before: dict[str, Any]) -> dict[str, float]:
    return {
        "gain": round(after["success"] - before["success"], 3),
        "se": round(math.hypot(after["se"], before["se"]), 3),
    }


def task_success(rewards: list[dict[str, Any]]) -> dict[str, float]:
    """Each task's share of solved rollouts (reward 1), in the order the tasks first appear."""
    runs: dict[str, list[float]] = {}
    for r in rewards:
        runs.setdefault(r["task_id"], []).append(float(r["reward"] >= 1.0))
    return {task: sum(v) / len(v) for task, v in runs.items()}


def paired_gain(work: Path, after: str, before: str) -> dict[str, float]:
    """The gain of stage ``after`` over ``before`` task by task (the same held-out tasks; a task's
    success rate where it ran several times): its standard error is that of the per-task
    differences, sd(d) / sqrt(n), and the tasks each way it moved."""
    solved = {}
    for name in (after, before):
        solved[name] = task_success(json.loads((work / f"eval-{name}" / "rewards.json").read_text()))
    tasks = sorted(solved[before])
    d = [solved[after][t] - solved[before][t] for t in tasks]
    n = len(d)
    mean_d = sum(d) / n
    var = sum((x - mean_d) ** 2 for x in d) / (n - 1) if n > 1 else 0.0
    return {
        "gain": round(mean_d, 3),
        "paired_se": round(math.sqrt(var / n), 3),
        "to_pass": sum(x > 0 for x in d),
        "to_fail": sum(x < 0 for x in d),
    }


def write_svg(result: dict[str, Any], path: Path) -> None:
    """Held-out success at each stage as bars with two-standard-error whiskers, as a small SVG (no
    plotting library needed)."""
    stages = [(k, result["heldout"][k]) for k in ("base", "sft", "rl") if k in result["heldout"]]
    width, height, pad, bar = 420, 260, 44, 70
    labels = {"base": "base model", "sft": "after SFT", "rl": "after SFT + RL"}

    def y(value: float) -> float:
        return height - pad - (height - 2 * pad) * max(0.0, min(1.0, value))

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(
            f'<line x1="{pad}" y1="{y(tick):.1f}" x2="{width - pad}" y2="{y(tick):.1f}" stroke="#eee"/>'
        )
        parts.append(f'<text x="{pad - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick:.2f}</text>')
    step = (width - 2 * pad) / max(1, len(stages))
    for i, (key, h) in enumerate(stages):
        x = pad + step * i + (step - bar) / 2
        mid = x + bar / 2
        value, se = h["success"], h["se"]
        parts.append(
            f'<rect x="{x:.1f}" y="{y(value):.1f}" width="{bar}" height="{y(0) - y(value):.1f}" fill="#2b5fb4"/>'
        )
        lo, hi = y(value - 2 * se), y(value + 2 * se)
        parts.append(f'<line x1="{mid:.1f}" y1="{lo:.1f}" x2="{mid:.1f}" y2="{hi:.1f}" stroke="#222"/>')
        parts.append(
            f'<text x="{mid:.1f}" y="{min(hi, y(value)) - 6:.1f}" text-anchor="middle">{value:.2f}</text>'
        )
        parts.append(f'<text x="{mid:.1f}" y="{height - pad + 16}" text-anchor="middle">{labels[key]}</text>')
    n = stages[0][1]["tasks"] if stages else 0
    parts += [
        f'<text x="{width / 2}" y="18" text-anchor="middle">held-out success, {n} tasks, greedy '
        "(± 2 s.e.)</text>",
        f'<text x="{width / 2}" y="{height - 8}" text-anchor="middle">{result["student"]} through '
        f"{result['harness'].split(' (')[0]}</text>",
        "</svg>",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--example", choices=sorted(EXAMPLES), default="assistant")
    parser.add_argument("--teacher-tasks", type=int, help="training tasks the teacher records (SIZES)")
    parser.add_argument("--heldout", type=int, help="held-out tasks evaluated at each stage")
    parser.add_argument("--sft-epochs", type=int)
    parser.add_argument("--sft-sequences-per-step", type=int)
    parser.add_argument("--rl-steps", type=int)
    parser.add_argument("--rl-tasks-per-step", type=int)
    parser.add_argument("--rl-group-size", type=int)
    parser.add_argument(
        "--rl-select", type=int, metavar="N",
        help="RL trains only on the tasks the SFT model solves sometimes, out of N training tasks the "
        "teacher did not record (each calibrated --rl-select-k times); 0: on every training task (SIZES)",
    )  # fmt: skip
    parser.add_argument("--rl-select-k", type=int, default=4, help="rollouts per candidate (--rl-select)")
    parser.add_argument("--smoke", action="store_true", help=f"the smallest run of every stage: {SMOKE}")
    parser.add_argument("--sft-set", action="append", default=[], help="more sft.toml overrides")
    parser.add_argument("--rl-set", action="append", default=[], help="more train.toml overrides (RL run)")
    parser.add_argument(
        "--eval-set", action="append", default=[], help="train.toml overrides for evaluations"
    )
    parser.add_argument(
        "--eval-samples", type=int, default=1,
        help="rollouts per held-out task at each evaluation (more than 1 with a sampling temperature: "
        "--eval-set trainer.eval_temperature=0.7)",
    )  # fmt: skip
    parser.add_argument(
        "--sampled-evals", type=int, default=0, metavar="K",
        help="also evaluate SFT and RL K times a held-out task at train.toml's training temperature "
        "(heldout.sft_sampled, rl_sampled): a success rate a task, finer than greedy's pass or fail",
    )  # fmt: skip
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp folder)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--resume", action="store_true", help="skip the stages --out already holds")
    parser.add_argument("--evaluate", metavar="MODEL", help=argparse.SUPPRESS)  # one evaluation (internal)
    parser.add_argument("--tasks", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    example = EXAMPLES[args.example]
    if args.evaluate:
        asyncio.run(
            evaluate_in_process(
                example, args.evaluate, args.tasks, args.work, args.eval_set, args.eval_samples
            )
        )
        return
    for key, value in (SMOKE if args.smoke else SIZES[args.example]).items():
        if not args.smoke and getattr(args, key) is not None:
            continue  # a flag given
        setattr(args, key, value)
    name = example.results + ("_smoke" if args.smoke else "")
    out = args.out or ROOT / "benchmarks" / "results" / f"{name}.json"
    work = args.work or Path(tempfile.mkdtemp(prefix="distill-learning-"))
    work.mkdir(parents=True, exist_ok=True)
    log(f"work folder {work}")

    train_tasks = read_jsonl(example.folder / example.train_tasks)[: args.teacher_tasks]
    heldout_file = work / "heldout.jsonl"
    heldout_file.write_text(
        "".join(
            line + "\n"
            for line in (example.folder / example.heldout_tasks).read_text().splitlines()[: args.heldout]
        )
    )
    result: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python benchmarks/distill_learning.py " + " ".join(sys.argv[1:]),
        "harness": example.harness,
        "student": "SmolLM2-135M-Instruct",
        "teacher": example.teacher,
        "config": {
            k: getattr(args, k)
            for k in (
                "example",
                "teacher_tasks",
                "heldout",
                "sft_epochs",
                "sft_sequences_per_step",
                "rl_steps",
                "rl_tasks_per_step",
                "rl_group_size",
                "rl_select",
                "rl_select_k",
                "sft_set",
                "rl_set",
                "eval_set",
                "eval_samples",
                "sampled_evals",
            )
        },  # fmt: skip
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_at_start": load_average()},
        "stages": {},
        "heldout": {},
    }

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")

    if args.resume and out.exists():  # keep the stages a stopped run finished (same --work)
        done = json.loads(out.read_text())
        result["stages"], result["heldout"] = done["stages"], done["heldout"]
        result["resumed_from"] = done["date"]
    stages, heldout = result["stages"], result["heldout"]

    def stage(name: str, key: str, table: dict[str, Any], fn: Any) -> None:
        if key in table:
            log(f"{name}: done in an earlier run, kept")
            return
        with Stage(name) as timed:
            value = fn()
        if table is stages:
            stages[key] = {**value, **timed.report}
        else:
            table[key] = value
            stages[f"eval_{key}"] = timed.report
        save()

    def evaluation(
        name: str, model: Any, sets: list[str] = args.eval_set, samples: int = args.eval_samples
    ) -> Any:
        return lambda: evaluate(
            args.example,
            model(),
            heldout_file,
            work / f"eval-{name}",
            work / f"eval-{name}.log",
            sets,
            samples,
        )

    stage("base evaluation", "base", heldout, evaluation("base", lambda: "smollm2"))
    stage("teacher", "teacher", stages, lambda: record_teacher(example, train_tasks, work))
    sft_sizes = (args.sft_epochs, args.sft_sequences_per_step)
    stage("sft", "sft", stages, lambda: sft(example, work, *sft_sizes, args.sft_set))
    stage("sft evaluation", "sft", heldout, evaluation("sft", lambda: stages["sft"]["checkpoint"]))
    rl_sets = args.rl_set
    if args.rl_select:
        candidates = read_jsonl(example.folder / example.train_tasks)[args.teacher_tasks :][: args.rl_select]
        select = (stages["sft"]["checkpoint"], args.rl_select_k, args.rl_set)
        stage("rl tasks", "rl_tasks", stages, lambda: select_rl_tasks(example, candidates, work, *select))
        rl_sets = [f"tasks.path={stages['rl_tasks']['tasks_file']}", *rl_sets]
    rl_sizes = (args.rl_steps, args.rl_tasks_per_step, args.rl_group_size)
    stage("rl", "rl", stages, lambda: rl(example, work, stages["sft"]["checkpoint"], *rl_sizes, rl_sets))
    stage("rl evaluation", "rl", heldout, evaluation("rl", lambda: stages["rl"]["checkpoint"]))
    if args.sampled_evals:  # as RL samples: its temperature, the evaluations' token cap
        from harnessrl.config import load_raw_config

        temperature = load_raw_config(example.folder / "train.toml", args.rl_set)["trainer"]["temperature"]
        sampled = [*args.eval_set, f"trainer.eval_temperature={temperature}"]
        for key in ("sft", "rl"):
            name, checkpoint = f"{key}_sampled", stages[key]["checkpoint"]
            evaluated = evaluation(name, lambda c=checkpoint: c, sampled, args.sampled_evals)
            stage(f"{key} evaluation, sampled", name, heldout, evaluated)
    result["gains"] = {
        "sft_over_base": gain(heldout["sft"], heldout["base"]),
        "rl_over_sft": gain(heldout["rl"], heldout["sft"]),
        "rl_over_base": gain(heldout["rl"], heldout["base"]),
    }
    result["paired_gains"] = {
        "sft_over_base": paired_gain(work, "sft", "base"),
        "rl_over_sft": paired_gain(work, "rl", "sft"),
        "rl_over_base": paired_gain(work, "rl", "base"),
    }
    if "rl_sampled" in heldout:
        result["paired_gains"]["rl_over_sft_sampled"] = paired_gain(work, "rl_sampled", "sft_sampled")
    spent = [stages[key] for key in ("sft", "rl_tasks", "rl") if key in stages]  # choosing RL's tasks is RL's
    result["sft_plus_rl"] = {
        "wall_minutes": round(sum(s["wall_s"] for s in spent) / 60, 2),
        "cpu_minutes": round(sum(s["cpu_s"] for s in spent) / 60, 2),
    }
    result["machine"]["load_at_end"] = load_average()
    save()
    if not args.smoke:
        write_svg(result, ROOT / "docs" / "images" / f"{out.stem}.svg")
    print(
        json.dumps(
            {"heldout": {k: (v["success"], v["se"]) for k, v in heldout.items()}, "gains": result["gains"]}
        )
    )


if __name__ == "__main__":
    main()
