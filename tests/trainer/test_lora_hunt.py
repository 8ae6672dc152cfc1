"""LoRA checkpoints and exports as a user meets them (``trainer/lora.py``): a run resumes its own
adapter however its ``target_modules`` were written; an adapter on ``lm_head`` holds its low-rank
layers only, not the head's base weight; ``harnessrl export`` of a run folder takes its newest
checkpoint; an export that cannot be written leaves nothing behind and says why (exit 2)."""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests.trainer.test_lora import ANSWER, PROMPT, step

from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.errors import ConfigError
from harnessrl.trainer.checkpoint import TrainState, write_checkpoint
from harnessrl.trainer.config import LoraSection, OptimizerConfig
from harnessrl.trainer.lora import save_adapter_state
from harnessrl.trainer.policy import TrainablePolicy

PROJECTIONS = {
    "self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
}


def policy(model_dir: Path, lora: LoraSection, adapter_dir: Path | None = None) -> TrainablePolicy:
    return TrainablePolicy(
        model_dir, optimizer=OptimizerConfig(lr=1e-2), total_steps=4, lora=lora, adapter_dir=adapter_dir
    )


def four_layer_model(tmp_path: Path) -> Path:
    """The tiny model's shapes with four decoder layers (random weights): 28 linear layers in them."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(tiny_model_dir()))
    config.num_hidden_layers, config.max_window_layers = 4, 4
    config.layer_types = ["full_attention"] * 4
    torch.manual_seed(0)
    folder = tmp_path / "four-layers"
    AutoModelForCausalLM.from_config(config).save_pretrained(str(folder))
    return folder


def every_layer_by_name(layers: int) -> list[str]:
    return [
        f"model.layers.{i}.{block}.{name}"
        for i in range(layers)
        for block, names in PROJECTIONS.items()
        for name in names
    ]


@pytest.mark.parametrize("written", ["a name twice", "every layer by its full name"])
def test_a_run_resumes_its_own_adapter_however_its_target_modules_were_written(tmp_path, written):
    """PEFT saves ``target_modules`` as a set (a repeated name is gone) and rewrites 20 or more of
    them to the suffixes that select the same layers (``q_proj``...): the check of a resumed adapter
    compared them as written and refused the run's own adapter on every ``--resume``."""
    if written == "a name twice":
        model_dir, targets = tiny_model_dir(), ["q_proj", "v_proj", "q_proj"]
    else:
        model_dir = four_layer_model(tmp_path)
        targets = every_layer_by_name(4)
    lora = LoraSection(r=4, alpha=8, target_modules=targets)
    first = policy(model_dir, lora)
    step(first, 0)
    write_checkpoint(first, TrainState(step=1), tmp_path / "run", save_every=0)
    adapter = tmp_path / "run" / "checkpoints" / "latest" / "adapter"
    saved = json.loads((adapter / "adapter_config.json").read_text())["target_modules"]
    assert sorted(saved) != sorted(targets)  # what PEFT wrote is not what the config says

    resumed = policy(model_dir, lora, adapter)
    assert resumed.response_logprobs(PROMPT, ANSWER) == pytest.approx(
        first.response_logprobs(PROMPT, ANSWER), abs=1e-6
    )
    # Control: an adapter on other layers is still refused, naming the field.
    fewer = LoraSection(r=4, alpha=8, target_modules=targets[:-2] if len(targets) > 3 else ["q_proj"])
    with pytest.raises(ConfigError, match=r"^trainer\.lora\.target_modules: .* was trained with "):
        policy(model_dir, fewer, adapter)


def test_an_adapter_on_lm_head_holds_its_low_rank_layers_and_not_the_heads_weight(tmp_path):
    """PEFT's default ("auto") wrote the whole base weight of an adapted ``lm_head`` (vocabulary x
    hidden) into every adapter: every checkpoint, every adapter a server loads, every export (2.2 MB
    beside 9 kB on the tiny model; gigabytes on a large one). A resume and plain PEFT take that
    weight from the base model."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    lora = LoraSection(r=4, alpha=8, target_modules=["q_proj", "lm_head"])
    first = policy(tiny_model_dir(), lora)
    step(first, 0)
    step(first, 1)
    folder = first.save_checkpoint(tmp_path / "ckpt")
    state = {k: v.detach().clone() for k, v in first.model.state_dict().items()}
    save_adapter_state(first.model, state, tmp_path / "gathered")  # a sharded policy's way
    for adapter in (folder / "adapter", tmp_path / "gathered"):
        keys = set(load_file(str(adapter / "adapter_model.safetensors")))
        assert any("lm_head.lora_B" in k for k in keys)  # control: the head's adapter is there
        assert all(".lora_A." in k or ".lora_B." in k for k in keys), sorted(keys)

    want = first.response_logprobs(PROMPT, ANSWER)
    resumed = policy(tiny_model_dir(), lora, folder / "adapter")
    resumed.load_trainer_state(folder)
    assert resumed.response_logprobs(PROMPT, ANSWER) == pytest.approx(want, abs=1e-6)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir()), dtype=torch.float32)
    plain = PeftModel.from_pretrained(base, str(folder / "adapter")).eval()
    with torch.no_grad():
        logits = plain(torch.tensor([PROMPT + ANSWER])).logits[0].log_softmax(-1)
    got = [logits[len(PROMPT) - 1 + i, t].item() for i, t in enumerate(ANSWER)]
    assert got == pytest.approx(want, abs=1e-5)


def harnessrl(*args: str, preexec_fn=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harnessrl", *args],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=preexec_fn,
    )


def test_export_of_a_run_folder_takes_its_newest_checkpoint(tmp_path):
    """A run that ended (``final`` at step 1), resumed to train longer and stopped at step 2 before
    writing a new ``final``: its newest weights are ``latest``'s, and exporting the run folder gave
    the stale ``final``."""
    lora = LoraSection(r=4, alpha=8)
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.json").write_text("{}")  # a run folder holds its config.json too
    trained = policy(tiny_model_dir(), lora)
    step(trained, 0)
    final = trained.save_checkpoint(run_dir / "checkpoints" / "final", with_optimizer=False)
    (final / "harnessrl_final.json").write_text(json.dumps({"step": 1}) + "\n")
    write_checkpoint(trained, TrainState(step=1), run_dir, save_every=0)
    # Control: at the same step, the run's final checkpoint is the one exported.
    done = harnessrl("export", str(run_dir), str(tmp_path / "at-final"))
    assert done.returncode == 0, done.stderr
    adapter = "adapter_model.safetensors"
    assert (tmp_path / "at-final" / adapter).read_bytes() == (final / "adapter" / adapter).read_bytes()

    step(trained, 1)  # the resumed run's step 2, then a stop: final is still step 1's
    write_checkpoint(trained, TrainState(step=2), run_dir, save_every=0)
    latest = run_dir / "checkpoints" / "latest"
    assert (latest / "adapter" / adapter).read_bytes() != (final / "adapter" / adapter).read_bytes()
    done = harnessrl("export", str(run_dir), str(tmp_path / "newest"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "newest" / adapter).read_bytes() == (latest / "adapter" / adapter).read_bytes()


def small_files_only() -> None:
    """In the export's process: files over 100 kB cannot be written (as on a full disk)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))


def test_an_export_that_cannot_be_written_leaves_nothing_and_says_why(tmp_path):
    """A copy that failed half way (here: files over 100 kB refused, as on a full disk) was a
    traceback and left a half-written OUT (a truncated model.safetensors), so the retry was refused:
    "already exists"."""
    checkpoint = policy(tiny_model_dir(), LoraSection(r=4, alpha=8)).save_checkpoint(
        tmp_path / "ckpt", with_optimizer=False
    )
    out = tmp_path / "exports" / "merged"
    failed = harnessrl("export", "--merged", str(checkpoint), str(out), preexec_fn=small_files_only)
    assert failed.returncode == 2, failed.stderr[-2000:]
    assert failed.stderr.startswith(f"harnessrl: error: {out}: could not be written (")
    assert not out.parent.exists()  # nor a partial folder, nor the folder made for it
    done = harnessrl("export", "--merged", str(checkpoint), str(out))  # the retry, with room to write
    assert done.returncode == 0, done.stderr
    assert (out / "model.safetensors").read_bytes() == (checkpoint / "model.safetensors").read_bytes()
    assert not (out / "adapter").exists() and not (out / "trainer_state.pt").exists()
    shutil.rmtree(out)
