"""``python -m harnessrl.tasks.coding build|evaluate``.

``build --out DIR [--limit N] [--seed S] [--mutants-per-problem K] [--problems ID,...] [--jobs J]``
writes a task set (``build``); its report is the last stdout line (JSON).

``evaluate [TASK_FILE] --hidden DIR [--timeout S]`` is the evaluator's command, run over a copy of
the rollout's workspace inside the scorer's sandbox (``hidden``): checks the probed values, restores
and runs the hidden tests, and prints ``{"reward": 0.0 | 1.0, "flags": [...], ...}`` as its last
line. The task comes from ``TASK_FILE`` or ``$HARNESSRL_TASK_FILE``. Exit status 2 (the controller
records a flagged 0) only when the task itself is broken, never because of the policy's code.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harnessrl.errors import HarnessRLError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harnessrl.tasks.coding", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build a task set from HumanEval")
    build.add_argument("--out", type=Path, required=True, help="output folder (an earlier build is replaced)")
    build.add_argument("--limit", type=int, default=None, help="stop after this many tasks")
    build.add_argument("--seed", type=int, default=0, help="which mutants are chosen")
    build.add_argument(
        "--mutants-per-problem", type=int, default=1, help="tasks (bugs) per HumanEval problem"
    )
    build.add_argument(
        "--problems", default="", help="comma-separated HumanEval ids (default: all, in order)"
    )
    build.add_argument("--jobs", type=int, default=2, help="problems screened at once")
    evaluate = sub.add_parser("evaluate", help="restore and run a task's hidden tests in the current folder")
    evaluate.add_argument(
        "task_file",
        type=Path,
        nargs="?",
        help="the task JSON (default: $HARNESSRL_TASK_FILE, set by the evaluator)",
    )
    evaluate.add_argument("--hidden", type=Path, required=True, help="the task's hidden folder")
    evaluate.add_argument("--timeout", type=float, default=60.0, help="seconds for the whole test run")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            from harnessrl.tasks.coding.build import BuildOptions, build_task_set

            problems = tuple(p.strip() for p in args.problems.split(",") if p.strip())
            options = BuildOptions(
                out=args.out,
                limit=args.limit,
                seed=args.seed,
                mutants_per_problem=args.mutants_per_problem,
                problems=problems,
                jobs=args.jobs,
            )
            print(json.dumps(build_task_set(options)))
        else:
            from harnessrl.tasks.coding.hidden import evaluate_task
            from harnessrl.tasks.pytest_scoring import read_task

            task = read_task(args.task_file)
            print(json.dumps(evaluate_task(task, args.hidden, Path.cwd(), timeout_s=args.timeout)))
    except HarnessRLError as exc:
        print(f"harnessrl: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
