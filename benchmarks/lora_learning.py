"""Does the arithmetic example still learn with LoRA? Held-out gain of LoRA vs full fine-tuning at
equal steps (issue 41).

Each arm is the main job as users start it, launched and measured by ``cpu_budget.run_job`` (a
``harnessrl train`` subprocess, its process tree sampled from ``/proc`` every second):

- ``lora``: ``examples/arithmetic/train_lora.toml``, run as ``train.toml`` plus the keys in which
  the two files differ (``[trainer.lora]``, ``optimizer.lr``, ``run.name``) as ``--set`` overrides,
  so both arms share one launcher and cannot drift apart in anything else;
- ``full``: ``examples/arithmetic/train.toml`` (full fine-tuning).

The arms run the code of one commit (``--commit``, default ``HEAD``) from a ``git worktree`` in a
scratch folder, not this checkout, whose uncommitted files (other people's work in progress) may
change under a run that takes an hour. Same seed, tasks, group size, ``--steps`` and held-out
evaluation (100 problems, greedy, at steps 0, 10 and 20); float32 engine and trainer (``--dtype``, as ``results/cpu_budget_20_steps.json``). Arms
run one after the other, LoRA first, and the JSON is written after each, so a LoRA-only result
survives if the full arm is stopped. LoRA is compared with the full arm where there is one and always
with the committed full-fine-tuning run (``--reference``, labelled as an earlier run), at each step
both evaluated and in the gain to the last such step. ``--combine`` merges the arms of separate runs of
this script (the two arms started as two processes at the same time, so both see the same load).

Standard errors: held-out success is a share of n = 100 problems, SE = sqrt(p (1 - p) / n); a gain
or a LoRA-minus-full difference adds the two variances (the problems are the same in both, and a
problem solved once is likelier solved again, so this overstates the SE of the paired difference). It is sampling error of the problems only: two
runs of the same config also differ (async rollouts, T = 0.7), which it does not cover.

    .venv/bin/python benchmarks/lora_learning.py                       # both arms, ~50+ min on 2 cores
    .venv/bin/python benchmarks/lora_learning.py --arms lora           # LoRA only, vs the committed run
    .venv/bin/python benchmarks/lora_learning.py --arms lora --out /tmp/lora.json &    # both at once,
    .venv/bin/python benchmarks/lora_learning.py --arms full --out /tmp/full.json; wait  # then
    .venv/bin/python benchmarks/lora_learning.py --combine /tmp/lora.json /tmp/full.json
    .venv/bin/python benchmarks/lora_learning.py --arms lora --steps 2 --set trainer.eval_every=0 \\
        --out /tmp/pilot.json                                          # a pilot: does the setting train
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_budget import cpu_description, git, load1, log, run_job  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "arithmetic"
RESULTS = ROOT / "benchmarks" / "results" / "lora_learning.json"
REFERENCE = ROOT / "benchmarks" / "results" / "cpu_budget_20_steps.json"


def flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def lora_overrides() -> list[str]:
    """``train_lora.toml`` as ``--set`` overrides of ``train.toml``: the keys it changes or adds."""
    full = flatten(tomllib.loads((EXAMPLE / "train.toml").read_text()))
    lora = flatten(tomllib.loads((EXAMPLE / "train_lora.toml").read_text()))
    if missing := set(full) - set(lora):
        raise SystemExit(f"train_lora.toml lacks keys of train.toml: {sorted(missing)}")
    # json.dumps writes these values (numbers, strings, lists of strings) as TOML reads them
    return [f"{k}={json.dumps(v)}" for k, v in lora.items() if full.get(k) != v]


def se(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n)


def heldout_with_se(heldout: list[list[float]], n: int) -> list[dict[str, Any]]:
    return [{"step": int(s), "success": p, "se": round(se(p, n), 3)} for s, p in heldout]


def gain(points: list[dict[str, Any]], to_step: int | None = None) -> dict[str, Any] | None:
    """Held-out success at ``to_step`` (default the last evaluation) minus at the first."""
    last = next((p for p in points if p["step"] == to_step), None) if to_step is not None else points[-1]
    if len(points) < 2 or last is None or last is points[0]:
        return None
    first = points[0]
    return {
        "from_step": first["step"],
        "to_step": last["step"],
        "gain": round(last["success"] - first["success"], 3),
        "se": round(math.hypot(first["se"], last["se"]), 3),
    }


def summarise(job: dict[str, Any], n: int) -> dict[str, Any]:
    points = heldout_with_se(job["heldout"], n)
    rewards = job["reward_mean"]
    return {
        "heldout": points,
        "heldout_gain": gain(points),
        "reward_mean_first3": round(sum(rewards[:3]) / 3, 3) if len(rewards) >= 3 else None,
        "reward_mean_last3": round(sum(rewards[-3:]) / 3, 3) if len(rewards) >= 3 else None,
    }


def compare(lora: dict[str, Any], full: dict[str, Any], full_source: str) -> dict[str, Any]:
    """LoRA minus full fine-tuning at each step both evaluated, and of the gains to the last such step."""
    by_step = {p["step"]: p for p in full["heldout"]}
    at_steps = [
        {
            "step": p["step"],
            "lora_minus_full": round(p["success"] - by_step[p["step"]]["success"], 3),
            "se": round(math.hypot(p["se"], by_step[p["step"]]["se"]), 3),
        }
        for p in lora["heldout"]
        if p["step"] in by_step
    ]
    out: dict[str, Any] = {"full_source": full_source, "full_heldout": full["heldout"], "at_steps": at_steps}
    ours = gain(lora["heldout"], at_steps[-1]["step"]) if at_steps else None
    theirs = gain(full["heldout"], at_steps[-1]["step"]) if at_steps else None
    if ours and theirs:
        d, s = ours["gain"] - theirs["gain"], math.hypot(ours["se"], theirs["se"])
        out["gain_lora_minus_full"] = {
            "to_step": ours["to_step"],
            "lora": ours["gain"],
            "full": theirs["gain"],
            "difference": round(d, 3),
            "se": round(s, 3),
            "z": round(d / s, 2) if s else None,
        }
    return out


def with_comparison(result: dict[str, Any], reference: Path) -> dict[str, Any]:
    """Add LoRA vs full fine-tuning: vs the full arm in ``result`` if it has one, and always vs the
    committed full-fine-tuning run ``reference``."""
    arms = result["arms"]
    if "lora" not in arms:
        return result
    result["comparison"] = {}
    if "full" in arms:
        result["comparison"]["vs_full_arm"] = compare(arms["lora"], arms["full"], "the full arm in this file")
    ref = json.loads(reference.read_text())
    source = (
        f"{reference.relative_to(ROOT)} ({ref['date']}, commit {ref['current']['commit'][:7]}): "
        "an earlier run on the same machine and config, not this run"
    )
    full = summarise(ref["current"]["job"], result["heldout_problems"])
    result["comparison"]["vs_reference"] = compare(arms["lora"], full, source)
    return result


def combine(paths: list[Path]) -> dict[str, Any]:
    """One result from the arms of several runs of this script (e.g. the two arms run at the same
    time as two processes); each arm keeps the date, commit and command of its own run."""
    runs = [json.loads(p.read_text()) for p in paths]
    result = {k: v for k, v in runs[0].items() if k not in ("arms", "comparison", "date", "argv", "commit")}
    result["arms"] = {}
    for run in runs:
        for arm, job in run["arms"].items():
            result["arms"][arm] = {
                "started": run["date"],
                "commit": run["commit"],
                "argv": run["argv"],
                **job,
            }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arms", default="lora,full", help="comma-separated, run in this order")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "auto"])
    parser.add_argument("--set", action="append", default=[], help="more --set overrides for both arms")
    parser.add_argument(
        "--reference", type=Path, default=REFERENCE, help="full-FT run to compare without a full arm"
    )
    parser.add_argument("--commit", default="HEAD", help="the code the arms run (a worktree of it)")
    parser.add_argument(
        "--combine", type=Path, nargs="+", help="merge the arms of these results; run nothing"
    )
    parser.add_argument(
        "--note", action="append", default=[], help="with --combine: what happened, for the record"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.combine:
        result = with_comparison(combine(args.combine), args.reference)
        result["notes"] = args.note
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result["comparison"], indent=2))
        return
    code = Path(tempfile.mkdtemp(prefix="lora-learning-code-"))
    subprocess.run(["git", "worktree", "add", "--detach", str(code), args.commit], cwd=ROOT, check=True)
    try:
        run_arms(args, code)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(code)], cwd=ROOT, check=False)


def run_arms(args: argparse.Namespace, code: Path) -> None:
    n = sum(1 for line in (EXAMPLE / "heldout.jsonl").read_text().splitlines() if line.strip())
    result: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "argv": sys.argv[1:],
        "commit": git(code, "rev-parse", "HEAD"),
        "dtype": args.dtype,
        "machine": {"cpu": cpu_description(), "load1_at_start": load1()},
        "heldout_problems": n,
        "lora_overrides": lora_overrides(),
        "note": "load1 is the 1-minute load average; the machine was shared with other work",
        "arms": {},
    }
    for arm in args.arms.split(","):
        extra = (lora_overrides() if arm == "lora" else []) + args.set
        work = Path(tempfile.mkdtemp(prefix=f"lora-learning-{arm}-"))
        try:
            job = run_job(code, args.steps, args.dtype, work, extra)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        job.pop("forward_tokens", None)
        job.update(summarise(job, n))
        result["arms"][arm] = job
        log(f"{arm}: {json.dumps(job)}")
        args.out.write_text(json.dumps(with_comparison(result, args.reference), indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
