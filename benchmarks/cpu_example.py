"""The CPU example (examples/arithmetic) trained by harnessrl and by TRL's GRPOTrainer, side by side.

What is measured, for each side on the same CPU, one after the other in this script: greedy held-out
accuracy on the 100 problems of ``examples/arithmetic/heldout.jsonl`` (none occurs in the training
tasks) before and after training, the number of optimizer steps done, and the wall-clock minutes.

- **harnessrl**: ``harnessrl train examples/arithmetic/train.toml`` as a subprocess, unchanged
  except for ``run.dir`` and the step budget. Every episode is the unmodified calculator agent
  (``examples/calculator_agent/agent.py``, an OpenAI-SDK script, possibly several model calls and
  calculator tool calls) talking to the gateway; the reward is the ``reasoning_gym`` evaluator
  (strict). Held-out accuracy is the trainer's own greedy evaluation through the same agent.
- **TRL 1.16** ``GRPOTrainer``: the same model (SmolLM2-135M-Instruct, fp32 master weights, bf16
  autocast), the same training tasks, token for token the prompt of the agent's first call (its
  system prompt, its calculator tool schema as the chat template renders it, the task prompt) but a
  single completion per episode (no tool is run), T = 0.7, 32 new tokens, 4 prompts x 8
  generations per step, lr 5e-6 constant, no KL; reward = the same answer extraction and strict
  reasoning-gym score. Held-out accuracy: greedy ``generate`` on the same 100 prompts, scored alike.

Budgets: ``--steps N`` gives both sides N optimizer steps; ``--minutes M`` gives each side M minutes
of training wall time (whatever number of steps fits). When the harnessrl run is stopped by the
minute budget, its last checkpoint is evaluated by an evaluation-only ``harnessrl train`` run on that
checkpoint (the step-0 held-out evaluation of a new run, stopped once it is written).
``cpu_minutes`` is wall time of training including the periodic held-out evaluations the config asks
for (harnessrl: from its step-0 row to the row of the step whose checkpoint is evaluated, so the
shutdown after the budget is not charged; ``stopped_after_minutes`` is until the process ended) and
excluding the before/after evaluations (TRL: ``trainer.train()``, whose last step may end past the
budget); ``train_minutes`` excludes all evaluation for both where it can be separated.
``comparison`` holds both gains with their standard errors (100 problems) and the time ratio.
``--curve-every N`` also saves a harnessrl checkpoint every N steps and evaluates each after the run:
``heldout_curve_minutes`` is ``[step, training minutes to that step, held-out accuracy]``, and
``comparison.harnessrl_reaches_trl_gain`` the first of those whose gain is at least TRL's.

What it does not show: a like-for-like episode (TRL's episode is one completion; harnessrl's is an
agent process that may call the calculator and the model again), or results at other scales. The CPU
is shared with whatever else runs on the machine; wall times move with it.

    ./install.sh --bench                                             # once: TRL 1.16.0 (both sides need it)
    .venv/bin/python benchmarks/cpu_example.py --minutes 20          # 20 min per side, ~45 min in all
    .venv/bin/python benchmarks/cpu_example.py --steps 73            # TRL's anchor length
    .venv/bin/python benchmarks/cpu_example.py --steps 2 --side trl  # one side; keeps the other's result
    .venv/bin/python benchmarks/cpu_example.py --minutes 20 --side harnessrl --curve-every 6
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "arithmetic"
CONFIG = EXAMPLE / "train.toml"
AGENT = ROOT / "examples" / "calculator_agent" / "agent.py"
RESULTS = ROOT / "benchmarks" / "results" / "cpu_example.json"
MODEL = "SmolLM2-135M-Instruct"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def budget_text(steps: int | None, budget_s: float | None) -> str:
    return f"{steps} steps" if steps else f"{(budget_s or 0) / 60:.0f} min"


def example_config() -> dict[str, Any]:
    return tomllib.loads(CONFIG.read_text())


# -- harnessrl -------------------------------------------------------------------------------------------
def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def stop_run(proc: subprocess.Popen, *, first_wait_s: float) -> None:
    """Stop a ``harnessrl train`` process group: Ctrl-C (cancels the run's main task), a second one
    (raises KeyboardInterrupt), then SIGKILL. The checkpoint evaluated is the last whole one either way."""
    for sig, wait_s in ((signal.SIGINT, first_wait_s), (signal.SIGINT, 120), (signal.SIGKILL, None)):
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def harnessrl_train(
    run_dir: Path, overrides: list[str], *, budget_s: float | None, stop_on_heldout: bool = False
):
    """Run ``harnessrl train`` on the example; stop it at its first held-out row, or ``budget_s`` after
    the first metrics row (the step-0 held-out evaluation: model loading and that evaluation are not
    charged to the budget, as TRL's are not). Returns (seconds charged, whether it was stopped)."""
    argv = [sys.executable, "-m", "harnessrl", "train", str(CONFIG), "--set", f"run.dir={run_dir}"]
    for item in ["metrics.progress=false", *overrides]:
        argv += ["--set", item]
    started = launched = time.monotonic()
    first_row = False
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # A benchmark started in the background (`cmd &` in a script) inherits SIGINT as ignored,
            # and so would the run: then Ctrl-C cannot stop it and it trains past the budget (seen:
            # 2 min, 3 steps, until SIGKILL). Give the run the default disposition back.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        stopped = False
        while proc.poll() is None:
            time.sleep(2)
            rows = read_metrics(run_dir)
            if rows and not first_row:
                first_row, started = True, time.monotonic()
            if stop_on_heldout and any("heldout/success_rate" in r for r in rows):
                stopped = True
            if budget_s is not None and first_row and time.monotonic() - started > budget_s:
                stopped = True
            if stopped:
                stop_run(proc, first_wait_s=20)
                break
    seconds = time.monotonic() - (started if first_row else launched)
    if proc.returncode not in (0, None) and not stopped:
        tail = (run_dir.parent / f"{run_dir.name}.log").read_text()[-4000:]
        raise RuntimeError(f"harnessrl train failed ({proc.returncode}):\n{tail}")
    return seconds, stopped


def evaluate_checkpoint(work: Path, checkpoint: Path) -> float | None:
    """Greedy held-out accuracy of a checkpoint: the step-0 evaluation of an evaluation-only run."""
    eval_dir = work / f"harnessrl-eval-{checkpoint.name}"
    harnessrl_train(
        eval_dir,
        [f"engine.model={checkpoint}", "trainer.steps=1", "trainer.eval_every=1", "run.name=arith-eval"],
        budget_s=None,
        stop_on_heldout=True,
    )
    rows = [r for r in read_metrics(eval_dir) if "heldout/success_rate" in r]
    shutil.rmtree(eval_dir, ignore_errors=True)
    return rows[0]["heldout/success_rate"] if rows else None


def run_harnessrl(
    work: Path, steps: int | None, budget_s: float | None, eval_every: int, curve_every: int = 0
) -> dict[str, Any]:
    run_dir = work / "harnessrl"
    overrides = [
        f"trainer.steps={steps or 100_000}",
        f"trainer.eval_every={eval_every if steps else 100_000}",
    ]
    if curve_every:  # numbered checkpoints (written in the background), evaluated after the run
        overrides.append(f"trainer.save_every={curve_every}")
    log(f"harnessrl: training ({budget_text(steps, budget_s)})")
    seconds, stopped = harnessrl_train(run_dir, overrides, budget_s=budget_s)
    rows = read_metrics(run_dir)
    heldout = [r for r in rows if "heldout/success_rate" in r]
    trained = [r for r in rows if r.get("reward/mean") is not None]
    result: dict[str, Any] = {
        "heldout_reward_before": heldout[0]["heldout/success_rate"]
        if heldout and heldout[0]["step"] == 0
        else None,
        "steps": trained[-1]["step"] if trained else 0,
        "cpu_minutes": round(seconds / 60, 2),
        "train_minutes": round(sum(r["time/step_s"] for r in trained) / 60, 2),
        "model": MODEL,
        "heldout_curve": [[r["step"], r["heldout/success_rate"]] for r in heldout],
        "reward_curve": [[r["step"], round(r["reward/mean"], 3)] for r in trained],
        "stopped_by_budget": stopped,
    }
    if heldout and heldout[-1]["step"] == result["steps"] and result["steps"] > 0:
        result["heldout_reward_after"] = heldout[-1]["heldout/success_rate"]
    else:
        from harnessrl.trainer.checkpoint import latest_checkpoint

        checkpoint = latest_checkpoint(run_dir)  # "latest", or "latest.old" if stopped mid-swap
        if checkpoint is None:
            raise RuntimeError(f"no checkpoint in {run_dir}: was the budget shorter than one step?")
        result["steps"] = json.loads((checkpoint / "harnessrl_state.json").read_text())["step"]
        # Charge the time up to the evaluated step (its metrics row), not the shutdown after it.
        by_step = {r["step"]: r["time"] for r in rows if "time" in r}
        if 0 in by_step and result["steps"] in by_step:
            result["stopped_after_minutes"] = result["cpu_minutes"]
            result["cpu_minutes"] = round((by_step[result["steps"]] - by_step[0]) / 60, 2)
            result["train_minutes"] = round(
                sum(r["time/step_s"] for r in trained if r["step"] <= result["steps"]) / 60, 2
            )
        log(f"harnessrl: evaluating {checkpoint} (step {result['steps']})")
        result["heldout_reward_after"] = evaluate_checkpoint(work, checkpoint)
    if curve_every:
        # Held-out accuracy against the training minutes it took to get there (step-0 row to the
        # step's row), from the numbered checkpoints: how soon harnessrl reaches a given gain.
        times = {r["step"]: r["time"] for r in rows if "time" in r and "step" in r}
        curve = []
        for folder in sorted((run_dir / "checkpoints").glob("step-*")):
            step = int(folder.name.removeprefix("step-"))
            if step >= result["steps"] or step not in times or 0 not in times:
                continue
            log(f"harnessrl: evaluating {folder.name}")
            accuracy = evaluate_checkpoint(work, folder)
            curve.append([step, round((times[step] - times[0]) / 60, 2), accuracy])
        if result.get("heldout_reward_after") is not None:
            curve.append([result["steps"], result["cpu_minutes"], result["heldout_reward_after"]])
        result["heldout_curve_minutes"] = curve
    return result


# -- TRL ---------------------------------------------------------------------------------------------
def agent_prompt(tokenizer: Any, prompt: str) -> str:
    """The exact text of the calculator agent's first model call: its system prompt, its calculator tool
    schema and the task prompt, rendered with the model's chat template (token for token what the
    gateway builds for the agent's request)."""
    sys.path.insert(0, str(AGENT.parent))
    try:
        from agent import SYSTEM, TOOLS  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)


def strict_reward(task: dict[str, Any], text: str, pattern: str, fallback: str = "last_number") -> float:
    """The ``reasoning_gym`` evaluator's rule: extract "Answer: X" (else per ``fallback``), score, >= 1."""
    import re

    from harnessrl.tasks.answers import extract_answer
    from harnessrl.tasks.reasoning_gym import score_answer

    answer = extract_answer(text, re.compile(pattern), fallback)  # type: ignore[arg-type]
    if answer is None:
        return 0.0
    return 1.0 if score_answer(task, answer) >= 1.0 else 0.0


def trl_heldout(
    model: Any, tokenizer: Any, heldout: list[Any], max_tokens: int, pattern: str, fallback: str
) -> float:
    import torch

    model.eval()
    correct = 0.0
    tokenizer.padding_side = "left"
    for start in range(0, len(heldout), 25):
        chunk = heldout[start : start + 25]
        texts = [agent_prompt(tokenizer, t.data["prompt"]) for t in chunk]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            out = model.generate(
                **enc, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
        for task, ids in zip(chunk, out[:, enc["input_ids"].shape[1] :], strict=True):
            correct += strict_reward(
                task.data, tokenizer.decode(ids, skip_special_tokens=True), pattern, fallback
            )
    model.train()
    return correct / len(heldout)


def run_trl(work: Path, steps: int | None, budget_s: float | None) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from harnessrl.engines.models import resolve_model_dir
    from harnessrl.tasks.jsonl import load_tasks
    from harnessrl.trainer.task_sources import parse_task_source

    cfg = example_config()
    t = cfg["trainer"]
    pattern = cfg["evaluator"].get("answer_pattern", r"Answer:\s*(.+)")
    fallback = cfg["evaluator"].get("fallback", "last_line")
    train = parse_task_source(cfg["tasks"]).load(split="train")
    heldout = load_tasks(EXAMPLE / cfg["heldout"]["path"])
    model_dir = str(resolve_model_dir(cfg["engine"]["model"]))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(cfg["run"].get("seed", 0))

    log("trl: held-out evaluation (before)")
    before = trl_heldout(model, tokenizer, heldout, t["max_tokens"], pattern, fallback)
    log(f"trl: before = {before}")
    by_prompt = {agent_prompt(tokenizer, task.data["prompt"]): task.data for task in train}

    def reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        out = []
        for prompt, completion in zip(prompts, completions, strict=True):
            task = by_prompt[prompt]
            text = completion
            out.append(strict_reward(task, text, pattern, fallback))
        return out

    class Budget(TrainerCallback):
        def __init__(self) -> None:
            self.started = 0.0
            self.step_seconds: list[float] = []
            self._t0 = 0.0

        def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
            self.started = time.monotonic()

        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
            self._t0 = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
            self.step_seconds.append(time.monotonic() - self._t0)
            if budget_s is not None and time.monotonic() - self.started > budget_s:
                control.should_training_stop = True

    budget = Budget()
    n = t["tasks_per_step"] * t["group_size"]
    config = GRPOConfig(
        output_dir=str(work / "trl"),
        per_device_train_batch_size=n,
        num_generations=t["group_size"],
        max_completion_length=t["max_tokens"],
        temperature=t["temperature"],
        learning_rate=cfg["optimizer"]["lr"],
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        beta=0.0,
        max_steps=steps or 100_000,
        bf16=t.get("autocast") == "bf16",
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=cfg["run"].get("seed", 0),
    )
    dataset = Dataset.from_dict({"prompt": list(by_prompt)})
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[budget],
    )
    log(f"trl: training ({budget_text(steps, budget_s)})")
    started = time.monotonic()
    trainer.train()
    seconds = time.monotonic() - started
    rewards = [
        [h["step"], round(h["reward"], 3)] for h in trainer.state.log_history if "reward" in h and "step" in h
    ]
    log("trl: held-out evaluation (after)")
    after = trl_heldout(trainer.model, tokenizer, heldout, t["max_tokens"], pattern, fallback)
    return {
        "heldout_reward_before": before,
        "heldout_reward_after": after,
        "steps": trainer.state.global_step,
        "cpu_minutes": round(seconds / 60, 2),
        "train_minutes": round(sum(budget.step_seconds) / 60, 2),
        "model": MODEL,
        "reward_curve": rewards,
    }


def compare(result: dict[str, Any]) -> dict[str, Any]:
    """Held-out gains, their standard errors (100 problems: a gain is the difference of two
    proportions, SE = sqrt(p1(1-p1)/n + p2(1-p2)/n)), and the time ratio harnessrl/TRL."""
    trl = result.get("trl") or {}
    out: dict[str, Any] = {}
    for name, side in (("harnessrl", result), ("trl", trl)):
        before, after = side.get("heldout_reward_before"), side.get("heldout_reward_after")
        if before is None or after is None:
            continue
        n = 100
        out[f"{name}_gain"] = round(after - before, 3)
        out[f"{name}_gain_se"] = round(((before * (1 - before) + after * (1 - after)) / n) ** 0.5, 3)
    if "harnessrl_gain" in out and "trl_gain" in out:
        out["gain_difference"] = round(out["harnessrl_gain"] - out["trl_gain"], 3)
    if result.get("cpu_minutes") and trl.get("cpu_minutes"):
        out["time_ratio_harnessrl_to_trl"] = round(result["cpu_minutes"] / trl["cpu_minutes"], 3)
    if result.get("steps") and trl.get("steps"):
        out["steps_ratio_harnessrl_to_trl"] = round(result["steps"] / trl["steps"], 3)
    before = result.get("heldout_reward_before")
    if "trl_gain" in out and before is not None and trl.get("cpu_minutes"):
        # The first evaluated harnessrl step whose held-out gain is at least TRL's whole-run gain.
        for step, minutes, accuracy in result.get("heldout_curve_minutes", []):
            if accuracy is not None and accuracy - before >= out["trl_gain"] - 1e-9:
                out["harnessrl_reaches_trl_gain"] = {
                    "step": step,
                    "minutes": minutes,
                    "time_ratio_to_trl": round(minutes / trl["cpu_minutes"], 3),
                }
                break
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--steps", type=int, help="optimizer steps per side")
    budget.add_argument("--minutes", type=float, help="training wall-clock minutes per side")
    parser.add_argument("--side", choices=["both", "harnessrl", "trl"], default="both")
    parser.add_argument("--eval-every", type=int, default=None, help="harnessrl: default the config's")
    parser.add_argument(
        "--curve-every",
        type=int,
        default=0,
        help="harnessrl: also save a checkpoint every N steps and evaluate each after the run "
        "(held-out accuracy against training minutes; evaluation time is not charged)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work", type=Path, default=None, help="keep run folders here (default: temp)")
    args = parser.parse_args()

    cfg = example_config()
    load_start = os.getloadavg()
    eval_every = args.eval_every or cfg["trainer"]["eval_every"]
    budget_s = args.minutes * 60 if args.minutes else None
    with tempfile.TemporaryDirectory(prefix="harnessrl-cpu-example-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        result: dict[str, Any] = {}
        if args.side != "both" and args.out.exists():  # one side: keep the other side's last result
            result = json.loads(args.out.read_text())
            result["settings"] = {**result.get("settings", {}), "sides_run_separately": True}
        if args.side in ("both", "harnessrl"):
            result.pop("heldout_curve_minutes", None)
            result.update(run_harnessrl(work, args.steps, budget_s, eval_every, args.curve_every))
            log(f"harnessrl: {json.dumps(result)}")
        if args.side in ("both", "trl"):
            result["trl"] = run_trl(work, args.steps, budget_s)
            log(f"trl: {json.dumps(result['trl'])}")
    import torch
    import transformers
    import trl

    result["settings"] = {
        **result.get("settings", {}),
        "budget": {"steps": args.steps} if args.steps else {"minutes_per_side": args.minutes},
        "config": str(CONFIG.relative_to(ROOT)),
        "harnessrl_eval_every": eval_every,
        "harnessrl_curve_every": args.curve_every,
        "heldout": "examples/arithmetic/heldout.jsonl (100 problems, none in the training tasks)",
        "trl_anchor_issue_5": {
            "steps": 73,
            "cpu_minutes": 25.2,
            "heldout_before": 0.38,
            "heldout_after": 0.61,
        },
    }
    result["versions"] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
    }
    result["comparison"] = compare(result)
    result["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_avg_start_end": [load_start, os.getloadavg()],
    }
    result["date"] = datetime.now(UTC).isoformat(timespec="seconds")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
