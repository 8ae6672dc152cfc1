"""Checkpoints after a kill mid-write (``trainer/checkpoint.py``): a run resumed from what the kill
left keeps writing whole checkpoints, loadable as Hugging Face folders."""

from __future__ import annotations

from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.trainer.checkpoint import TrainState, latest_checkpoint, write_checkpoint
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
