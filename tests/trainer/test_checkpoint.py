"""Checkpoints after a kill mid-write (``trainer/checkpoint.py``): a run resumed from what the kill
left keeps writing whole checkpoints, loadable as Hugging Face folders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.trainer.checkpoint import STATE_FILE, TrainState, latest_checkpoint, write_checkpoint
from harnessrl.trainer.config import OptimizerConfig
from harnessrl.trainer.policy import TrainablePolicy

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def new_policy(model_dir) -> TrainablePolicy:
    return TrainablePolicy(model_dir, optimizer=OptimizerConfig(lr=1e-2), total_steps=4)


def test_a_run_resumed_from_latest_old_writes_checkpoints_with_their_tokenizer(tmp_path):
    """Regression: a kill between the swap's two renames leaves ``latest.old`` alone, and a resumed
    run loads its policy from there; its first checkpoint then deletes ``latest.old``, and every
    later one (``checkpoints/final`` included) was written without the tokenizer files the policy
    copied from its folder: neither vLLM nor the next ``--resume``'s engine could load them."""
    from transformers import AutoTokenizer

    assert all((tiny_model_dir() / name).exists() for name in TOKENIZER_FILES)
    write_checkpoint(new_policy(tiny_model_dir()), TrainState(step=1), tmp_path, save_every=0)
    root = tmp_path / "checkpoints"
    (root / "latest").rename(root / "latest.old")  # what a kill between the renames leaves

    folder = latest_checkpoint(tmp_path)
    assert folder == root / "latest.old"
    resumed = new_policy(folder)
    resumed.load_trainer_state(folder)
    for step in (2, 3):
        write_checkpoint(resumed, TrainState(step=step), tmp_path, save_every=2)
    resumed.save_checkpoint(root / "final", with_optimizer=False)

    assert not (root / "latest.old").exists()
    for written in (root / "latest", root / "step-00002", root / "final"):
        assert [name for name in TOKENIZER_FILES if not (written / name).exists()] == [], written
        AutoTokenizer.from_pretrained(str(written))
    assert latest_checkpoint(tmp_path) == root / "latest"


def whole_copy_of(numbered, latest, *, but: tuple[str, ...]) -> bool:
    """``numbered`` holds every file of ``latest`` byte for byte, except those named ``but``."""
    names = sorted(p.name for p in latest.iterdir() if p.name not in but)
    return sorted(p.name for p in numbered.iterdir() if p.name not in but) == names and all(
        (numbered / name).read_bytes() == (latest / name).read_bytes() for name in names
    )


def test_a_numbered_copy_a_kill_cut_short_is_copied_again_by_the_resumed_run(tmp_path):
    """Regression: ``step-NNNNN`` was copied in place after ``latest`` was swapped in. A kill during
    the copy left a half-written folder under the final name; the resumed run went on from
    ``latest`` (step 2) at step 3 and never rewrote it, and ``harnessrl export`` took it for a
    whole checkpoint (a ``config.json`` and a ``*.safetensors``)."""
    policy = new_policy(tiny_model_dir())
    write_checkpoint(policy, TrainState(step=2), tmp_path, save_every=2)
    root = tmp_path / "checkpoints"
    numbered = root / "step-00002"
    # What the old in-place copy left when killed: some files missing, the weights half-written.
    weights = numbered / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (numbered / "config.json").unlink()
    # And what a kill during the new copy leaves: a hidden partial folder.
    partial = root / ".step-00002.partial"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")

    write_checkpoint(policy, TrainState(step=3), tmp_path, save_every=2)  # the resumed run's next step

    # The policy has not changed since step 2: its copy holds the weights ``latest`` (step 3) holds.
    assert whole_copy_of(numbered, root / "latest", but=("trainer_state.pt", STATE_FILE))
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-00002"]  # the partial one removed
    assert TrainState.from_json((numbered / STATE_FILE).read_text()).step == 2
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(numbered))


class LeavesAnUnreadableFile:
    """A policy whose checkpoints hold a link to nowhere: ``copytree`` copies the rest, then fails."""

    def __init__(self, policy: TrainablePolicy):
        self.policy = policy

    def save_checkpoint(self, folder, **kwargs):
        out = self.policy.save_checkpoint(folder, **kwargs)
        (out / "zz-unreadable").symlink_to(out / "nowhere")
        return out


def test_a_numbered_copy_that_fails_midway_leaves_no_numbered_folder(tmp_path):
    """Regression: the copy wrote under its final name, so one that stopped midway (here: a file it
    cannot read, as a kill or a full disk would stop it) left a ``step-NNNNN`` folder without it,
    which readers took for a whole checkpoint. Now it leaves only a hidden partial folder, which the
    next write removes."""
    policy = new_policy(tiny_model_dir())
    write_checkpoint(policy, TrainState(step=1), tmp_path, save_every=2)
    root = tmp_path / "checkpoints"
    with pytest.raises(shutil.Error):  # the copy stopped
        write_checkpoint(LeavesAnUnreadableFile(policy), TrainState(step=2), tmp_path, save_every=2)
    assert not (root / "step-00002").exists()

    (root / "latest" / "zz-unreadable").unlink()  # the next write's source is readable again
    write_checkpoint(policy, TrainState(step=3), tmp_path, save_every=2)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-00002"]


def test_a_finished_run_resumed_copies_again_the_numbered_checkpoint_a_kill_cut_short(tmp_path):
    """Regression: a kill during the last step's numbered copy left it half-written, and the
    ``--resume`` that finds the run finished ("already finished": no checkpoint is written) left it
    so. Files only: the resume loads no model."""
    from typer.testing import CliRunner

    from harnessrl.cli.main import app
    from harnessrl.trainer.run_setup import prepare_run

    tiny = Path(__file__).resolve().parents[2] / "examples" / "tiny" / "train.toml"
    shutil.copy(tiny, tmp_path / "train.toml")
    shutil.copy(tiny.parent / "agent.py", tmp_path / "agent.py")
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"task_id": "t0", "prompt": "Say a."}) + "\n")
    _, run_dir, _ = prepare_run(
        str(tmp_path / "train.toml"), None, ["trainer.steps=1", "trainer.save_every=1"]
    )
    latest = run_dir / "checkpoints" / "latest"
    latest.mkdir(parents=True)
    (latest / STATE_FILE).write_text(TrainState(step=1).to_json())
    (latest / "model.safetensors").write_bytes(b"w" * 1000)
    (latest / "trainer_state.pt").write_bytes(b"optimizer")
    numbered = run_dir / "checkpoints" / "step-00001"
    numbered.mkdir()
    (numbered / "model.safetensors").write_bytes(b"w" * 300)  # where the kill stopped the copy

    result = CliRunner().invoke(app, ["train", "--resume", str(run_dir)])

    assert result.exit_code == 0 and "already finished" in result.output, result.output
    assert whole_copy_of(numbered, latest, but=("trainer_state.pt",))
    assert not (numbered / "trainer_state.pt").exists()


def test_a_damaged_trainer_state_is_a_named_error_on_resume(tmp_path):
    """Regression: a ``trainer_state.pt`` cut short (a copy of the run folder interrupted, a bad disk)
    or holding something else ended ``harnessrl train --resume`` in a zip or pickle traceback from
    inside torch; it is a ``CheckpointUnreadable`` naming the file and what to do."""
    import torch

    from harnessrl.trainer.checkpoint import CheckpointUnreadable

    policy = new_policy(tiny_model_dir())
    folder = policy.save_checkpoint(tmp_path / "checkpoint")
    state_file = folder / "trainer_state.pt"
    whole = state_file.read_bytes()
    for damage in (whole[: len(whole) // 2], b""):
        state_file.write_bytes(damage)
        with pytest.raises(CheckpointUnreadable, match="trainer_state.pt cannot be loaded .*delete it"):
            new_policy(tiny_model_dir()).load_trainer_state(folder)
    torch.save(["not", "a", "trainer state"], state_file)
    with pytest.raises(CheckpointUnreadable, match="trainer_state.pt is not a trainer state"):
        new_policy(tiny_model_dir()).load_trainer_state(folder)
    state_file.write_bytes(whole)
    new_policy(tiny_model_dir()).load_trainer_state(folder)  # the whole file still loads
