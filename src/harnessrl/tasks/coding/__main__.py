"""``python -m harnessrl.tasks.coding build|evaluate``.

``build --out DIR [--limit N] [--seed S] [--mutants-per-problem K] [--problems ID,...] [--jobs J]``
writes a task set (``build``); its report is the last stdout line (JSON).

``evaluate [TASK_FILE] --hidden DIR [--timeout S]`` is the evaluator's command, run in the rollout's
workspace inside the sandbox: restores the hidden tests, runs them and prints
``{"reward": 0.0 | 1.0, ...}`` as its last line. Exit status 2 (the controller's "evaluator failed",
an infrastructure failure) only when the task itself is broken, never because of the policy's code.
"""

from __future__ import annotations

import argparse
import json
import os
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
        help="the task JSON (default: $HARNESSRL_TASK, set by the evaluator)",
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
            from harnessrl.tasks.coding.hidden import HiddenTestsError, evaluate_task

            where = str(args.task_file) if args.task_file else "$HARNESSRL_TASK"
            try:
                text = (
                    args.task_file.read_text(encoding="utf-8")
                    if args.task_file
                    else os.environ["HARNESSRL_TASK"]
                )
                task = json.loads(text)
            except (OSError, KeyError, ValueError) as exc:
                raise HiddenTestsError(f"cannot read the task from {where}: {exc!r}") from exc
            if not isinstance(task, dict):
                raise HiddenTestsError(f"the task in {where} is not a JSON object")
            print(json.dumps(evaluate_task(task, args.hidden, Path.cwd(), timeout_s=args.timeout)))
    except HarnessRLError as exc:
        print(f"harnessrl: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
