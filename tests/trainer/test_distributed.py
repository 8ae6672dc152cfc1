"""Data-parallel training (torchrun + FSDP2): the 2-rank step equals the 1-process step.

``test_two_ranks_train_like_one_process`` launches ``torchrun --standalone --nproc_per_node 2`` (gloo,
CPU) on this very file (the ``__main__`` block is the worker): the ranks train the tiny model for two
optimizer steps on fixed synthetic rollouts (different sample counts and lengths, rollout-level
advantages), save a checkpoint, reload it into a fresh sharded policy (weights + optimizer state),
and take a third step. The same three steps run here with the plain ``TrainablePolicy.train_step``;
the losses, gradient norms and final weights must match. Three modes: shared-prefix rows, packed
rows, and a KL penalty to a (sharded) reference model with the trainer proximal and ``tis_cap``.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.algorithms.packing import pack_micro_batches
from harnessrl.errors import ConfigError
from harnessrl.trainer.config import LoraSection, OptimizerConfig
from harnessrl.trajectory import Sample, SampledSpan

STEPS = 3
MICRO_BATCH_TOKENS = 64  # small: several micro-batches per rank, not the same number on both
OPTIMIZER = OptimizerConfig(lr=1e-4, schedule="linear", grad_clip=1.0)
#: Samples per rollout and their lengths: five rollouts split into 1 to 3 samples of 9 to 50 tokens.
SHAPES = [[40, 23, 31], [50], [12, 35], [9], [27, 18]]
ADVANTAGES = [1.0, -0.5, 0.7, -1.2, 0.3]


#: torchrun on two ranks. Each run's ``--log-dir`` is in the test's folder: by default torchrun makes
#: a ``torchelastic_*`` folder in /tmp for every launch and never removes it.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def make_samples(step: int) -> list[Sample]:
    """A step's worth of synthetic samples: a prompt, a response, tool output, another response.

    As in real agent traffic, all samples start with the same system prompt and a rollout's samples
    share a longer prefix (its task), so the shared-prefix micro-batching has something to share.
    """
    rng = random.Random(step)
    system = [rng.randrange(5, 4096) for _ in range(4)]
    samples = []
    for r, lengths in enumerate(SHAPES):
        task = system + [rng.randrange(5, 4096) for _ in range(3)]
        for i, n in enumerate(lengths):
            prompt = len(task) if len(lengths) > 1 else 2 + rng.randrange(3)
            first = max(1, (n - prompt - 3) // 2)
            mask = [0] * prompt + [1] * first + [0] * 3 + [1] * (n - prompt - first - 3)
            assert len(mask) == n and mask[-1] == 1
            ids = task[:prompt] + [rng.randrange(5, 4096) for _ in range(n - prompt)]
            samples.append(
                Sample(
                    rollout_id=f"s{step}-r{r}",
                    input_ids=ids,
                    loss_mask=mask,
                    behaviour_logprobs=[-8.3 + rng.uniform(-0.3, 0.3) if m else 0.0 for m in mask],
                    spans=[SampledSpan(prompt, n, 0, 0)],
                    sample_index=i,
                    advantage=ADVANTAGES[(r + step) % len(ADVANTAGES)],
                )
            )
    rng.shuffle(samples)  # a rollout's samples need not be adjacent in the step
    return samples


# -- assignment of rollouts to ranks ------------------------------------------------------------------
def test_assign_rollouts_keeps_rollouts_whole_and_balances_tokens():
    from harnessrl.trainer.distributed import assign_rollouts

    samples = make_samples(0)
    for world in (1, 2, 3, 4, 7):
        shards = assign_rollouts(samples, world)
        assert len(shards) == world
        # Every sample exactly once, in its original order within the rank.
        assert sorted(id(s) for shard in shards for s in shard) == sorted(id(s) for s in samples)
        for shard in shards:
            assert shard == [s for s in samples if any(s is t for t in shard)]
        owners = {}
        for rank, shard in enumerate(shards):
            for s in shard:
                assert owners.setdefault(s.rollout_id, rank) == rank  # never split across ranks
        tokens = {rid: sum(len(s) for s in samples if s.rollout_id == rid) for rid in owners}
        load = [sum(len(s) for s in shard) for shard in shards]
        # Greedy LPT: the busiest rank exceeds the least busy by at most one rollout.
        assert max(load) - min(load) <= max(tokens.values())
        assert assign_rollouts(samples, world) == shards  # deterministic
    assert [len(s) for s in assign_rollouts(samples, 7)].count(0) == 2  # 5 rollouts, 7 ranks


def test_assign_rollouts_two_ranks_is_the_best_split_here():
    from harnessrl.trainer.distributed import assign_rollouts

    def sample(rid: str, n: int) -> Sample:
        return Sample(
            rollout_id=rid, input_ids=[5] * n, loss_mask=[1] * n, behaviour_logprobs=[0.0] * n, spans=[]
        )

    # Rollout sizes 60 (as 30+30), 50, 40, 30, 20: LPT gives {60, 30, 20} / {50, 40} = 110 / 90.
    samples = [
        sample("a", 30),
        sample("b", 50),
        sample("a", 30),
        sample("c", 40),
        sample("d", 30),
        sample("e", 20),
    ]
    samples[2].sample_index = 1
    shards = assign_rollouts(samples, 2)
    assert [sorted({s.rollout_id for s in shard}) for shard in shards] == [["a", "d", "e"], ["b", "c"]]
    assert assign_rollouts([], 3) == [[], [], []]
    with pytest.raises(ConfigError):
        assign_rollouts(samples, 0)


# -- the equivalence test -----------------------------------------------------------------------------
#: mode: (share_prefixes, algorithm, with a reference model, LoRA). The first two are the two
#: micro-batchings of the step; the third adds the reference model's forward to every round (idle
#: ones too); the fourth trains LoRA adapters (frozen base sharded with them, the KL reference being
#: the base itself with the adapters off) and resumes the adapter from its checkpoint.
KL = AlgorithmConfig(kl_coef=0.1, proximal="trainer", tis_cap=1.5)
LORA = LoraSection(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
MODES = {
    "shared_prefixes": (True, AlgorithmConfig(), False, None),
    "packed_rows": (False, AlgorithmConfig(), False, None),
    "kl_ref": (True, KL, True, None),
    "lora_kl": (True, KL, True, LORA),
}


def reference_of(out: Path, model_dir: str | Path, lora: LoraSection | None) -> Path:
    """A mode's KL reference: LoRA's is the base model itself (its adapters switched off)."""
    return Path(model_dir) if lora is not None else reference_dir(out)


def reference_dir(out: Path) -> Path:
    """The KL mode's reference: the tiny model's weights, perturbed so that the KL term is far from
    0 from the first step (written by the test before torchrun starts)."""
    return out / "reference"


@pytest.mark.slow
def test_two_ranks_train_like_one_process(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from harnessrl.engines.tiny import tiny_model_dir
    from harnessrl.trainer.distributed import assign_rollouts
    from harnessrl.trainer.policy import TrainablePolicy
    from harnessrl.trainer.prefix_tree import prefix_micro_batches

    model_dir = tiny_model_dir()
    # The split really exercises the idle rounds: the ranks have different micro-batch counts.
    for split in (
        lambda shard: prefix_micro_batches(shard, MICRO_BATCH_TOKENS, 1024),
        lambda shard: pack_micro_batches(shard, MICRO_BATCH_TOKENS),
    ):
        counts = [[len(split(shard)) for shard in assign_rollouts(make_samples(s), 2)] for s in range(STEPS)]
        assert any(a != b for a, b in counts), counts

    perturbed = AutoModelForCausalLM.from_pretrained(str(model_dir))
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in perturbed.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=noise))
    perturbed.save_pretrained(str(reference_dir(tmp_path)))

    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}
    cmd = [*TORCHRUN, "--log-dir", str(tmp_path / "torchrun-logs")]
    proc = subprocess.run(
        [*cmd, __file__, str(model_dir), str(tmp_path)], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]

    for mode, (share, algorithm, with_reference, lora) in MODES.items():
        out = tmp_path / mode
        reference = TrainablePolicy(
            model_dir,
            optimizer=OPTIMIZER,
            total_steps=STEPS,
            share_prefixes=share,
            reference_dir=reference_of(tmp_path, model_dir, lora) if with_reference else None,
            lora=lora,
        )
        initial = {k: v.clone() for k, v in reference.engine_state_dict().items()}
        ref_metrics = []
        for s in range(STEPS):
            if s == 2:  # where the ranks saved their checkpoint
                at_checkpoint = {k: v.clone() for k, v in reference.engine_state_dict().items()}
            ref_metrics.append(
                reference.train_step(
                    make_samples(s), algorithm, temperature=1.0, micro_batch_tokens=MICRO_BATCH_TOKENS
                )
            )
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
        for metrics in ranks:  # every rank reports the aggregated metrics
            for step, (got, want) in enumerate(zip(metrics["steps"], ref_metrics, strict=True)):
                assert got["policy/world_size"] == 2
                assert set(got) == {*want, "policy/world_size"}, mode
                keys = [
                    "policy/loss",
                    "policy/lr",
                    "policy/entropy",
                    "policy/sampled_nll",
                    "policy/clip_fraction",
                    "policy/loss_tokens",
                ]
                if with_reference and lora is None:
                    assert want["policy/kl_ref"] > 1e-3 and want["policy/importance_weight_max"] > 1.0
                    keys += ["policy/kl_ref", "policy/importance_weight_mean", "policy/engine_trainer_kl"]
                for key in keys:
                    assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-9), (mode, key)
                # torch's fp32 norm of a 0.5M-element tensor is itself off by ~1e-5 relative (vs
                # fp64), differently for shards and the whole; the gradients agree to ~4e-7.
                assert got["policy/grad_norm"] == pytest.approx(want["policy/grad_norm"], rel=1e-4), mode
                if share:  # the ranks shared prefixes too (each among its own rollouts' samples)
                    assert got["policy/forward_tokens"] < sum(len(x) for x in make_samples(step))
        assert {r["rank"]: r["rollouts"] for r in ranks} == {
            r: sorted({x.rollout_id for x in assign_rollouts(make_samples(0), 2)[r]}) for r in range(2)
        }

        want = reference.engine_state_dict()
        got = torch.load(out / "weights.pt")
        assert set(got) == set(want)
        moved = max(float((want[k] - initial[k]).abs().max()) for k in want)
        assert moved > 1e-4  # training really changed the weights, far beyond the tolerance
        for name in want:
            torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=1e-5, msg=f"{mode} {name}")
        # The checkpoint rank 0 wrote after two steps is a plain Hugging Face folder with full weights
        # (with LoRA: merged, beside the adapter in PEFT's format, which the one process's equals).
        folder = out / "checkpoint"
        assert (folder / "trainer_state.pt").exists() and (folder / "tokenizer.json").exists()
        saved = AutoModelForCausalLM.from_pretrained(str(folder)).state_dict()
        for name in want:
            torch.testing.assert_close(saved[name], at_checkpoint[name], atol=1e-6, rtol=1e-5, msg=name)
        if lora is not None:
            from safetensors.torch import load_file

            reference.save_adapter(out / "adapter_one_process")
            mine = load_file(str(out / "adapter_one_process" / "adapter_model.safetensors"))
            theirs = load_file(str(out / "adapter" / "adapter_model.safetensors"))
            assert set(mine) == set(theirs) and mine
            for name in mine:
                torch.testing.assert_close(theirs[name], mine[name], atol=1e-6, rtol=1e-5, msg=name)
            assert (folder / "adapter" / "adapter_config.json").exists()


def _worker(model_dir: str, out: Path) -> None:
    """One torchrun rank, per mode: two steps, checkpoint, reload into a fresh sharded policy (weights
    and optimizer state), third step; then the full weights."""
    import functools

    import torch

    from harnessrl.trainer.distributed import ShardedPolicy, assign_rollouts, init_distributed
    from harnessrl.trainer.policy import TrainablePolicy

    ctx = init_distributed()
    for mode, (share, algorithm, with_reference, lora) in MODES.items():
        folder = out / mode
        folder.mkdir(exist_ok=True)
        build = functools.partial(
            TrainablePolicy,
            optimizer=OPTIMIZER,
            total_steps=STEPS,
            share_prefixes=share,
            reference_dir=reference_of(out, model_dir, lora) if with_reference else None,
            lora=lora,
        )
        sharded = ShardedPolicy(ctx, functools.partial(build, model_dir))
        steps = []
        for s in range(STEPS):
            if s == 2:
                checkpoint = folder / "checkpoint"
                sharded.save_checkpoint(checkpoint)
                if lora is None:
                    sharded = ShardedPolicy(ctx, functools.partial(build, str(checkpoint)))
                else:  # the run's base weights plus the checkpoint's adapter (as Trainer resumes)
                    resumed = functools.partial(build, model_dir, adapter_dir=checkpoint / "adapter")
                    sharded = ShardedPolicy(ctx, resumed)
                sharded.load_trainer_state(checkpoint)
            samples = make_samples(s)
            steps.append(
                sharded.train_step(samples, algorithm, temperature=1.0, micro_batch_tokens=MICRO_BATCH_TOKENS)
            )
        weights = sharded.engine_state_dict()
        if lora is not None:
            assert sharded.save_adapter(folder / "adapter")
        mine = sorted({x.rollout_id for x in assign_rollouts(make_samples(0), ctx.world_size)[ctx.rank]})
        if ctx.is_leader:
            torch.save(weights, folder / "weights.pt")
        (folder / f"rank{ctx.rank}.json").write_text(
            json.dumps({"rank": ctx.rank, "rollouts": mine, "steps": steps})
        )


# -- collocated run: rank 0 runs harnessrl train, rank 1 follows ---------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")
def test_torchrun_train_runs_the_collocated_stack_on_two_ranks(tmp_path):
    from transformers import AutoModelForCausalLM

    root = Path(__file__).resolve().parents[2]
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}
    cmd = [*TORCHRUN, "--log-dir", str(tmp_path / "torchrun-logs")]
    args = ["-m", "harnessrl.trainer.torchrun", str(root / "examples" / "tiny" / "train.toml")]
    for override in (
        f"run.dir={run_dir}",
        "trainer.steps=2",
        "trainer.group_size=4",
        "metrics.progress=false",
    ):
        args += ["--set", override]
    proc = subprocess.run([*cmd, *args], env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["world_size"] == 2
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "policy/loss" in r]
    assert [r["step"] for r in trained] == [1, 2]
    assert all(
        r["policy/world_size"] == 2 and r["rollouts/total"] == 16 and r["policy/grad_norm"] > 0
        for r in trained
    )
    AutoModelForCausalLM.from_pretrained(str(run_dir / "checkpoints" / "final"))  # full weights, HF format


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")
def test_torchrun_trains_lora_publishes_it_and_resumes_the_adapter(tmp_path):
    """LoRA over two ranks through the whole stack: each step's adapted layers reach the embedded
    engine, checkpoints hold the adapter, and ``--resume`` continues base + adapter (``adapter_dir``
    through the leader's policy factory to every rank)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    root = Path(__file__).resolve().parents[2]
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}
    cmd = [*TORCHRUN, "--log-dir", str(tmp_path / "torchrun-logs")]
    lora = ["trainer.lora.r=4", "trainer.lora.alpha=8", "trainer.group_size=4", "metrics.progress=false"]

    def run(*args: str) -> dict:
        argv = [*cmd, "-m", "harnessrl.trainer.torchrun", *args]
        for override in lora:
            argv += ["--set", override]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    config = str(root / "examples" / "tiny" / "train.toml")
    first = run(config, "--set", f"run.dir={run_dir}", "--set", "trainer.steps=2")
    assert first["steps"] == 2 and first["world_size"] == 2
    adapter = run_dir / "checkpoints" / "final" / "adapter"
    after_two = load_file(str(adapter / "adapter_model.safetensors"))
    assert after_two and all("lora_" in name for name in after_two)
    assert max(float(t.abs().max()) for n, t in after_two.items() if "lora_B" in n) > 0  # B left 0: trained

    resumed = run("--resume", str(run_dir), "--set", "trainer.steps=3")
    assert resumed["steps"] == 3 and resumed["world_size"] == 2
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "policy/loss" in r]
    assert [r["step"] for r in trained] == [1, 2, 3]
    assert all(r["policy/world_size"] == 2 and r["policy/grad_norm"] > 0 for r in trained)
    after_three = load_file(str(adapter / "adapter_model.safetensors"))
    assert set(after_three) == set(after_two)
    assert any(not (after_three[n] == after_two[n]).all() for n in after_two)  # step 3 moved the adapter
    AutoModelForCausalLM.from_pretrained(str(run_dir / "checkpoints" / "final"))  # merged weights, HF format


if __name__ == "__main__":
    import torch.distributed as dist

    _worker(sys.argv[1], Path(sys.argv[2]))
    dist.destroy_process_group()
