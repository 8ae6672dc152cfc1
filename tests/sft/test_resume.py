"""Resuming an SFT run mid-way trains exactly what the uninterrupted run trains: same batches, same
optimizer and LR-schedule state, bit-identical weights and losses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import load_file

from harnessrl.sft.config import SftConfig
from harnessrl.sft.run import SftRun, prepare_sft_run


def config(teacher: Path, run_dir: Path) -> SftConfig:
    return SftConfig.model_validate(
        {
            "run": {"name": "s", "dir": str(run_dir), "seed": 3},
            "source": {"run_dir": str(teacher)},
            "select": {"min_reward": 0.5},
            "sft": {"model": "tiny", "epochs": 2, "sequences_per_step": 1, "device": "cpu"},
            "optimizer": {"lr": 1e-3, "schedule": "cosine", "warmup_steps": 1},
            "metrics": {"tensorboard": False, "progress": False},
        }
    )


def losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["sft/loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_resuming_mid_sft_equals_an_uninterrupted_run(record, solving, tmp_path):
    second = [
        {"content": "Checking.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]},
        "Done.",
    ]
    rec = record([solving, second, solving], [1.0, 1.0, 1.0])
    whole, split = tmp_path / "whole", tmp_path / "split"

    done = SftRun(config(rec.run_dir, whole), whole).run()
    assert done["steps"] == done["total_steps"] == 6  # 3 sequences, one per step, 2 epochs

    first = SftRun(config(rec.run_dir, split), split, stop_after=2).run()
    assert first["steps"] == 2
    resumed_config, run_dir = prepare_sft_run(None, str(split), [])  # what `harnessrl sft --resume` reads
    assert run_dir == split and resumed_config == config(rec.run_dir, split)
    last = SftRun(resumed_config, split, resume=True).run()
    assert last["steps"] == 6

    assert losses(split) == losses(whole)
    a = load_file(whole / "checkpoints/latest/model.safetensors")
    b = load_file(split / "checkpoints/latest/model.safetensors")
    assert a.keys() == b.keys()
    assert all(a[k].equal(b[k]) for k in a), [k for k in a if not a[k].equal(b[k])]

    again = SftRun(resumed_config, split, resume=True).run()  # nothing left to do
    assert again.get("already_finished") and again["steps"] == 6

    # stopped after its last step's checkpoint but before the final one: resume writes it
    shutil.rmtree(split / "checkpoints/final")
    SftRun(resumed_config, split, resume=True).run()
    final = load_file(split / "checkpoints/final/model.safetensors")
    assert all(final[k].equal(a[k]) for k in a)


def test_a_finished_run_resumed_copies_again_a_numbered_checkpoint_a_kill_cut_short(
    record, solving, tmp_path
):
    """A kill during the last step's ``step-NNNNN`` copy left it half-written, and a resume of the
    finished run writes no checkpoint that would copy it again: the resume repairs it itself."""
    rec = record([solving, solving, solving], [1.0, 1.0, 1.0])
    run_dir = tmp_path / "run"
    cfg = config(rec.run_dir, run_dir).model_copy(deep=True)
    cfg.sft.save_every = 3
    assert SftRun(cfg, run_dir).run()["steps"] == 6
    numbered = run_dir / "checkpoints/step-00006/model.safetensors"
    whole = numbered.read_bytes()
    numbered.write_bytes(whole[: len(whole) // 2])  # what the kill left
    again = SftRun(cfg, run_dir, resume=True).run()
    assert again.get("already_finished")
    assert numbered.read_bytes() == whole
