"""A torchrun (sharded) policy resumed from its checkpoint restores every rank's torch generator, as
the one-process policy restores its own (``TrainablePolicy.load_trainer_state``): the steps after
``--resume`` draw the dropout masks the run would have drawn, not the first steps' again.

The test launches ``torchrun --standalone --nproc_per_node 2`` (gloo, CPU) on this very file (the
``__main__`` block is the worker): both ranks build the sharded tiny policy, draw a different amount
from their generators (as their different shares of a step do), save a checkpoint, note their next
draws, reseed (a fresh process), load the checkpoint and draw again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def test_a_sharded_policy_resumed_restores_every_ranks_generator(tmp_path):
    """Regression: ``ShardedPolicy.load_trainer_state`` restored the optimizer and LR schedule but
    not the generator state (and only rank 0's was saved), so a resumed torchrun run drew the
    freshly seeded generator's masks again on every rank."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}
    cmd = [*TORCHRUN, "--log-dir", str(tmp_path / "torchrun-logs"), __file__, str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in ranks:
        assert rank["after_resume"] == rank["expected"], rank
    assert ranks[0]["expected"] != ranks[1]["expected"]  # each rank its own generator, not rank 0's


def _worker(out: Path) -> None:
    import functools

    import torch

    from harnessrl.config import load_raw_config, validate_config
    from harnessrl.engines.tiny import tiny_model_dir
    from harnessrl.trainer.config import TrainConfig
    from harnessrl.trainer.distributed import ShardedPolicy, init_distributed
    from harnessrl.trainer.policy import TrainablePolicy

    root = Path(__file__).resolve().parents[2]
    ctx = init_distributed()
    config = validate_config(TrainConfig, load_raw_config(str(root / "examples/tiny/train.toml"), []))
    build = functools.partial(TrainablePolicy.from_config, config, tiny_model_dir())
    sharded = ShardedPolicy(ctx, build)
    torch.rand(10 * (ctx.rank + 1))  # the ranks' generators part ways, as in a step
    checkpoint = out / "checkpoint"
    sharded.save_checkpoint(checkpoint)  # every call a collective, on every rank
    expected = torch.rand(4).tolist()
    torch.manual_seed(config.run.seed)  # what a resumed run's policy starts from
    sharded.load_trainer_state(checkpoint)
    after_resume = torch.rand(4).tolist()
    (out / f"rank{ctx.rank}.json").write_text(
        json.dumps({"expected": expected, "after_resume": after_resume})
    )


if __name__ == "__main__":
    import torch.distributed as dist

    _worker(Path(sys.argv[1]))
    dist.destroy_process_group()
