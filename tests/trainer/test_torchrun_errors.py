"""``harnessrl.trainer.torchrun``'s command channel when a command fails on every rank alike.

A step the code refuses on all ranks together (``NonFiniteStep``: the loss and gradient norm are the
whole step's, the same on every rank) or a ``ConfigError`` every rank raises from the same config is
rank 0's to handle: its run stops with the named error and sends ``stop``. A follower that died of it
made torchrun kill rank 0 before it could report the error or record the run's status.

The test launches ``torchrun --standalone --nproc_per_node 2`` (gloo, CPU) on this very file (the
``__main__`` block is the worker): rank 0 drives a ``LeaderPolicy`` as ``Trainer`` does, rank 1 runs
``follow``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.trajectory import Sample, SampledSpan

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def make_samples() -> list[Sample]:
    """Four single-sample rollouts of 16 tokens, near the tiny model's own log-probs."""
    samples = []
    for r in range(4):
        mask = [0] * 6 + [1] * 10
        samples.append(
            Sample(
                rollout_id=f"r{r}",
                input_ids=[7 + 31 * r + i for i in range(16)],
                loss_mask=mask,
                behaviour_logprobs=[-8.3 if m else 0.0 for m in mask],
                spans=[SampledSpan(6, 16, 0, 0)],
                advantage=[1.0, -0.5, 0.7, -1.2][r],
            )
        )
    return samples


def run_torchrun(cmd: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run torchrun; if the ranks hang (the bug this file guards against), SIGTERM it after a
    generous bound: torchrun then stops its workers (a SIGKILL would leave them running)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, err = proc.communicate(timeout=120)
        err += "\nhung: torchrun stopped after 300 s"
    return proc.returncode, out, err


def unshardable_dir(out: Path) -> Path:
    return out / "gpt2-one-layer"


@pytest.mark.slow
def test_a_step_refused_on_every_rank_leaves_the_followers_following(tmp_path):
    """Regression: a follower let ``NonFiniteStep`` (and a ``ConfigError`` raised alike on every
    rank, building the policy or in a step) escape ``follow``, so it died with a traceback and torchrun killed rank 0 too. And a
    checkpoint rank 0 failed to write left the followers in the barrier after it, out of step with
    rank 0's next command. And a ``trainer_state.pt`` rank 0 could not load (damaged, or a one-process
    run's) failed on rank 0 alone, leaving the followers in ``set_optimizer_state_dict``'s collectives."""
    from transformers import GPT2Config, GPT2LMHeadModel

    # A model FSDP cannot be sharded by layer (no decoder.layers): a ConfigError on every rank's build.
    small = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=64, eos_token_id=0)
    GPT2LMHeadModel(small).save_pretrained(str(unshardable_dir(tmp_path)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}
    cmd = [*TORCHRUN, "--log-dir", str(tmp_path / "torchrun-logs"), __file__, str(tmp_path)]
    returncode, out, err = run_torchrun(cmd, env)
    assert returncode == 0, out[-3000:] + err[-6000:]
    leader = json.loads((tmp_path / "rank0.json").read_text())
    assert leader["refused"] == [
        "build: cannot shard GPT2LMHeadModel: no decoder.layers to wrap",
        "NonFiniteStep",
        "ConfigError",
        "NotADirectoryError",
        "damaged: CheckpointUnreadable",
        "one-process: CheckpointUnreadable",
    ]
    # the ranks were still in step: the clean step after the refusals ran on both and trained
    assert math.isfinite(leader["loss"]) and leader["grad_norm"] > 0 and leader["world_size"] == 2
    assert (tmp_path / "rank1.done").exists()  # rank 1 left follow() on rank 0's stop


def _worker(out: Path) -> None:
    import dataclasses

    import torch.distributed as dist

    from harnessrl.algorithms.config import AlgorithmConfig
    from harnessrl.config import load_raw_config, validate_config
    from harnessrl.engines.tiny import tiny_model_dir
    from harnessrl.errors import ConfigError
    from harnessrl.trainer.checkpoint import CheckpointUnreadable
    from harnessrl.trainer.config import TrainConfig
    from harnessrl.trainer.distributed import init_distributed
    from harnessrl.trainer.policy import TrainablePolicy
    from harnessrl.trainer.torchrun import follow, leader_policy_factory
    from harnessrl.trainer.train_step import NonFiniteStep

    root = Path(__file__).resolve().parents[2]
    ctx = init_distributed()
    if not ctx.is_leader:
        follow(ctx)
        (out / f"rank{ctx.rank}.done").write_text("stopped by rank 0\n")
        return
    config = validate_config(TrainConfig, load_raw_config(str(root / "examples/tiny/train.toml"), []))
    refused = []
    try:
        try:
            leader_policy_factory(ctx, config)(unshardable_dir(out), unshardable_dir(out))
        except ConfigError as exc:
            refused.append(f"build: {exc}")
        model_dir = tiny_model_dir()
        policy = leader_policy_factory(ctx, config)(model_dir, model_dir)

        def step(samples: list[Sample], algorithm: AlgorithmConfig) -> dict[str, float]:
            return policy.train_step(samples, algorithm, temperature=1.0, micro_batch_tokens=64)

        spoiled = make_samples()
        spoiled[1] = dataclasses.replace(spoiled[1], advantage=math.nan)
        # NonFiniteStep: the NaN advantage makes the whole step's loss NaN, on every rank;
        # ConfigError: a KL penalty without the reference model the policy was built without.
        for samples, algorithm in (
            (spoiled, AlgorithmConfig()),
            (make_samples(), AlgorithmConfig(kl_coef=0.1)),
        ):
            try:
                step(samples, algorithm)
            except (NonFiniteStep, ConfigError) as exc:
                refused.append(type(exc).__name__)
        # A checkpoint rank 0 cannot write (its folder's parent is a file; a full disk, say).
        (out / "a-file").write_text("not a folder\n")
        try:
            policy.save_checkpoint(out / "a-file" / "checkpoint")
        except OSError as exc:
            refused.append(type(exc).__name__)
        # A resume from a trainer_state.pt rank 0 cannot load: damaged (a copy cut short), or a
        # one-process run's (optimizer state by parameter index, not by name).
        damaged = policy.save_checkpoint(out / "damaged")
        whole = (damaged / "trainer_state.pt").read_bytes()
        (damaged / "trainer_state.pt").write_bytes(whole[: len(whole) // 2])
        one_process = TrainablePolicy.from_config(config, model_dir).save_checkpoint(out / "one-process")
        for folder in (damaged, one_process):
            try:
                policy.load_trainer_state(folder)
            except CheckpointUnreadable as exc:
                refused.append(f"{folder.name}: {type(exc).__name__}")
        metrics = step(make_samples(), AlgorithmConfig())
    finally:
        dist.broadcast_object_list([("stop", (), {})], src=0, group=ctx.control)
    (out / "rank0.json").write_text(
        json.dumps(
            {
                "refused": refused,
                "loss": metrics["policy/loss"],
                "grad_norm": metrics["policy/grad_norm"],
                "world_size": metrics["policy/world_size"],
            }
        )
    )


if __name__ == "__main__":
    import torch.distributed as dist

    _worker(Path(sys.argv[1]))
    dist.destroy_process_group()
