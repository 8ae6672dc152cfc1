"""Training throughput: harnessrl's ``TrainablePolicy.train_step`` vs TRL's ``GRPOTrainer`` step, on CPU.

What is measured: tokens per second of one optimizer step (forward + backward + grad clip + AdamW
step) over the *same* batch of sequences, for the same model, dtype setting and thread count, run
one after the other in this process. Tokens counted are the real (non-padding) prompt + completion
tokens of the batch, the same number for both, so ``ratio = harnessrl / trl`` is a ratio of step
times.

The batch: ``prompts`` reasoning-gym ``basic_arithmetic`` questions (2 terms, 1-2 digits, + and -)
rendered with SmolLM2-135M-Instruct's chat template (its default system prompt included), each with
``group`` completions of exactly ``completion_tokens`` tokens (random non-special token ids from a
seeded generator: throughput does not depend on what the tokens say), random 0/1 rewards turned into
GRPO advantages. Default 4 x 8 sequences x (~70 prompt + 32 completion) tokens, as in issue 5.

How each side is timed (generation excluded from both):

- **harnessrl**: samples (prompt tokens with loss mask 0, completion tokens with loss mask 1 and
  behaviour log-probs computed once beforehand by the same model) go through
  ``TrainablePolicy.train_step`` — packing into micro-batches of ``micro_batch_tokens``, the
  forward at the sampling temperature, the PPO-clip loss, backward, grad clip, optimizer and LR
  scheduler step. Timed with ``time.perf_counter`` around the call. Run twice: with shared-prefix
  rows (the default: the 8 completions of a group share their prompt, which is computed once) and
  without (``ratio_no_shared_prefixes``: every sequence computed in full, as TRL does).
- **TRL 1.16**: a real ``GRPOTrainer`` whose ``_generate_and_score_completions`` is replaced by a
  method returning the same batch in TRL's own layout (left-padded prompt ids/mask, completion
  ids/mask, advantages, ``num_items_in_batch``), so ``trainer.train()`` runs TRL's unmodified
  training loop (``compute_loss`` with its fused LM head, backward, grad clip, AdamW, scheduler)
  without generating. Timed from ``on_step_begin`` to ``on_step_end`` callbacks, which bracket
  exactly that work (the stub returns prebuilt tensors instantly).

Both keep fp32 master weights; ``--dtype bf16`` runs both forwards under CPU bf16 autocast (TRL via
``bf16=True``, i.e. accelerate's autocast; harnessrl via ``trainer.autocast = "bf16"``). The first
``--warmup`` steps of each are not counted. Same hyperparameters (lr 5e-6 constant, grad clip 1.0,
temperature 0.7, no KL / reference model).

What it does not show: GPU throughput, multi-turn samples (harnessrl's packing of long agent
traces), or the cost of generation, which dominates end-to-end RL time on CPU.

    ./install.sh --bench                                               # once: TRL 1.16.0 into .venv
    .venv/bin/python benchmarks/trainer_vs_trl.py                      # fp32 and bf16, ~6 min
    .venv/bin/python benchmarks/trainer_vs_trl.py --dtype bf16 --steps 3
    .venv/bin/python benchmarks/trainer_vs_trl.py --model tiny --dtype fp32 --prompts 2 --group 2 \
        --completion-tokens 8 --steps 1 --out /tmp/tvt.json            # smoke run, ~20 s
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "trainer_vs_trl.json"
ARITHMETIC = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 2,
    "operators": ["+", "-"],
    "allow_parentheses": False,
    "allow_negation": False,
}
LR = 5e-6
TEMPERATURE = 0.7


@dataclass
class Batch:
    prompts: list[list[int]]  # one per sequence (repeated within a group)
    completions: list[list[int]]
    advantages: list[float]
    pad_id: int

    @property
    def tokens(self) -> int:
        return sum(len(p) + len(c) for p, c in zip(self.prompts, self.completions, strict=True))


def build_batch(model_dir: Path, prompts: int, group: int, completion_tokens: int, seed: int) -> Batch:
    from transformers import AutoTokenizer

    from harnessrl.tasks.reasoning_gym import PROMPT_SUFFIX, reasoning_gym_tasks

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tasks = reasoning_gym_tasks("basic_arithmetic", prompts, seed, ARITHMETIC)
    rng = random.Random(seed)
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]
    out_prompts, completions, advantages = [], [], []
    for task in tasks:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": task.data["question"] + PROMPT_SUFFIX}],
            add_generation_prompt=True,
            tokenize=True,
        )
        ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        rewards = [float(rng.random() < 0.5) for _ in range(group)]
        if len(set(rewards)) == 1:
            rewards[0] = 1.0 - rewards[0]
        mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
        for r in rewards:
            out_prompts.append(ids)
            completions.append([rng.choice(vocab) for _ in range(completion_tokens)])
            advantages.append((r - mean) / (std + 1e-4))
    return Batch(out_prompts, completions, advantages, pad_id=tokenizer.pad_token_id or 0)


# -- harnessrl ---------------------------------------------------------------------------------------
def bench_harnessrl(
    model_dir: Path,
    batch: Batch,
    dtype: str,
    steps: int,
    warmup: int,
    micro_batch_tokens: int,
    share_prefixes: bool = True,
) -> dict[str, Any]:
    from harnessrl.algorithms.config import AlgorithmConfig
    from harnessrl.trainer.config import OptimizerConfig
    from harnessrl.trainer.policy import TrainablePolicy
    from harnessrl.trajectory import Sample
    from harnessrl.trajectory.samples import SampledSpan

    policy = TrainablePolicy(
        model_dir,
        optimizer=OptimizerConfig(lr=LR, grad_clip=1.0),
        total_steps=steps + warmup,
        autocast="bf16" if dtype == "bf16" else "none",
        share_prefixes=share_prefixes,
    )
    samples = []
    for i, (p, c, adv) in enumerate(zip(batch.prompts, batch.completions, batch.advantages, strict=True)):
        ids = p + c
        with torch.no_grad():  # behaviour log-probs, as the engine would have recorded them
            lp = policy.logprobs(torch.tensor([ids]), torch.arange(len(ids))[None], TEMPERATURE).logprobs[0]
        behaviour = [0.0] * len(p) + lp[len(p) :].tolist()
        samples.append(
            Sample(
                rollout_id=f"r{i}",
                input_ids=ids,
                loss_mask=[0] * len(p) + [1] * len(c),
                behaviour_logprobs=behaviour,
                spans=[SampledSpan(start=len(p), end=len(ids), policy_version=0, call_seq=0)],
                group_id=f"g{i // 8}",
                advantage=adv,
            )
        )
    algorithm = AlgorithmConfig()
    times = []
    for step in range(steps + warmup):
        t0 = time.perf_counter()
        policy.train_step(samples, algorithm, temperature=TEMPERATURE, micro_batch_tokens=micro_batch_tokens)
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    del policy
    return {"step_seconds": times, "micro_batch_tokens": micro_batch_tokens}


# -- TRL ---------------------------------------------------------------------------------------------
def trl_inputs(batch: Batch) -> dict[str, torch.Tensor]:
    P = max(len(p) for p in batch.prompts)
    prompt_ids = torch.full((len(batch.prompts), P), batch.pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(batch.prompts), P), dtype=torch.long)
    for i, p in enumerate(batch.prompts):  # TRL left-pads prompts
        prompt_ids[i, P - len(p) :] = torch.tensor(p)
        prompt_mask[i, P - len(p) :] = 1
    completion_ids = torch.tensor(batch.completions, dtype=torch.long)
    completion_mask = torch.ones_like(completion_ids)
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor(batch.advantages, dtype=torch.float32),
        "num_items_in_batch": completion_mask.sum(),
    }


def bench_trl(
    model_dir: Path, batch: Batch, dtype: str, steps: int, warmup: int, group: int
) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    inputs = trl_inputs(batch)

    class FixedBatchGRPOTrainer(GRPOTrainer):
        """GRPOTrainer with generation and scoring replaced by the prebuilt batch."""

        def _generate_and_score_completions(self, generation_batch: Any) -> dict[str, torch.Tensor]:
            return {k: v.clone() for k, v in inputs.items()}

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self._t0 = 0.0

        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
            self._t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
            self.times.append(time.perf_counter() - self._t0)

    n = len(batch.prompts)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    timer = StepTimer()
    with tempfile.TemporaryDirectory(prefix="trl-bench-") as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=n,
            num_generations=group,
            max_completion_length=len(batch.completions[0]),
            learning_rate=LR,
            lr_scheduler_type="constant",
            max_grad_norm=1.0,
            temperature=TEMPERATURE,
            beta=0.0,
            max_steps=steps + warmup,
            bf16=dtype == "bf16",
            use_cpu=True,
            report_to=[],
            save_strategy="no",
            logging_steps=1000,
            disable_tqdm=True,
            seed=0,
        )
        prompts = [f"p{i}" for i in range(n // group)]
        trainer = FixedBatchGRPOTrainer(
            model=model,
            reward_funcs=lambda completions, **_: [0.0] * len(completions),
            args=config,
            train_dataset=Dataset.from_dict({"prompt": prompts * 4}),
            processing_class=tokenizer,
            callbacks=[timer],
        )
        trainer.train()
    return {"step_seconds": timer.times[warmup:]}


def summarize(times: list[float], tokens: int) -> dict[str, Any]:
    median = statistics.median(times)
    return {
        "tokens_per_s": round(tokens / median, 1),
        "step_seconds_median": round(median, 3),
        "step_seconds": [round(t, 3) for t in times],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", choices=["fp32", "bf16", "both"], default="both")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--completion-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per side and dtype")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096, help="harnessrl's default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    from harnessrl.engines.models import resolve_model_dir

    torch.manual_seed(args.seed)
    model_dir = Path(resolve_model_dir(args.model))
    batch = build_batch(model_dir, args.prompts, args.group, args.completion_tokens, args.seed)
    dtypes = ["fp32", "bf16"] if args.dtype == "both" else [args.dtype]
    per_dtype: dict[str, Any] = {}
    for dtype in dtypes:
        print(f"{dtype}: harnessrl...", file=sys.stderr, flush=True)
        ours = bench_harnessrl(model_dir, batch, dtype, args.steps, args.warmup, args.micro_batch_tokens)
        print(f"{dtype}: harnessrl without shared prefixes...", file=sys.stderr, flush=True)
        plain = bench_harnessrl(
            model_dir, batch, dtype, args.steps, args.warmup, args.micro_batch_tokens, share_prefixes=False
        )
        print(f"{dtype}: trl...", file=sys.stderr, flush=True)
        theirs = bench_trl(model_dir, batch, dtype, args.steps, args.warmup, args.group)
        h, t = summarize(ours["step_seconds"], batch.tokens), summarize(theirs["step_seconds"], batch.tokens)
        n = summarize(plain["step_seconds"], batch.tokens)
        per_dtype[dtype] = {
            "harnessrl": h,
            "harnessrl_no_shared_prefixes": n,
            "trl": t,
            "ratio": round(h["tokens_per_s"] / t["tokens_per_s"], 3),
            "ratio_no_shared_prefixes": round(n["tokens_per_s"] / t["tokens_per_s"], 3),
        }
        print(f"  {dtype}: {json.dumps(per_dtype[dtype])}", file=sys.stderr, flush=True)
    headline = per_dtype["bf16" if "bf16" in per_dtype else dtypes[0]]
    import transformers
    import trl

    out = {
        "harnessrl_tokens_per_s": headline["harnessrl"]["tokens_per_s"],
        "trl_tokens_per_s": headline["trl"]["tokens_per_s"],
        "ratio": headline["ratio"],
        "ratio_no_shared_prefixes": headline["ratio_no_shared_prefixes"],
        "headline_dtype": "bf16" if "bf16" in per_dtype else dtypes[0],
        "per_dtype": per_dtype,
        "settings": {
            "model": args.model,
            "sequences": len(batch.prompts),
            "prompts": args.prompts,
            "group": args.group,
            "prompt_tokens": sorted({len(p) for p in batch.prompts}),
            "completion_tokens": args.completion_tokens,
            "tokens_per_step": batch.tokens,
            "timed_steps": args.steps,
            "warmup_steps": args.warmup,
            "harnessrl_micro_batch_tokens": args.micro_batch_tokens,
            "lr": LR,
            "temperature": TEMPERATURE,
        },
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
        },
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
