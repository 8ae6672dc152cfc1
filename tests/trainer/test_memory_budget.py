"""The preflight's memory estimate: a run that cannot fit in the machine's memory is refused before it
starts, with a message naming the setting to lower."""

from __future__ import annotations

from pathlib import Path

import pytest

from harnessrl.config import load_raw_config, resolve_relative_paths, validate_config
from harnessrl.errors import ConfigError
from harnessrl.trainer.config import TrainConfig
from harnessrl.trainer.memory_budget import (
    GB,
    SMOLLM2,
    ModelShape,
    check_memory,
    estimate_memory,
    model_shape,
)
from harnessrl.trainer.run_setup import preflight

ROOT = Path(__file__).resolve().parents[2]
MAIN_JOB = ROOT / "examples" / "arithmetic" / "train.toml"


def main_job(*overrides: str) -> TrainConfig:
    """The README's main job's config, as ``harnessrl train`` validates it."""
    raw = resolve_relative_paths(load_raw_config(str(MAIN_JOB), list(overrides)), MAIN_JOB.parent)
    return validate_config(TrainConfig, raw)


def test_the_main_job_is_refused_by_the_preflight_on_a_machine_too_small_for_it():
    config = main_job("engine.dtype=float32", "trainer.autocast=none")
    need = estimate_memory(config, SMOLLM2).total
    # One byte short: refused before anything starts, naming the setting of the largest part.
    with pytest.raises(
        ConfigError, match=r"needs about .* GB of memory .* lower (engine|trainer|controller)\."
    ):
        preflight(config, memory_available=lambda: need - 1)
    # Enough: the memory check passes (the rest of the preflight runs as on any machine).
    preflight(config, memory_available=lambda: need)


def test_the_message_names_the_setting_of_the_largest_part():
    config = main_job("engine.dtype=float32", "engine.context_length=8192", "trainer.micro_batch_tokens=1024")
    with pytest.raises(ConfigError, match=r"lower engine\.context_length \(now 8192\)"):
        check_memory(config, available=int(1 * GB))
    config = main_job("engine.context_length=512", "trainer.micro_batch_tokens=65536")
    with pytest.raises(ConfigError, match=r"lower trainer\.micro_batch_tokens \(now 65536\)"):
        check_memory(config, available=int(8 * GB))


#: The main job without gradient checkpointing (as it ships), so that switching it on shows.
PLAIN = ("engine.context_length=2048", "trainer.gradient_checkpointing=false")


def test_the_estimate_grows_with_each_setting_it_names():
    base = estimate_memory(main_job(*PLAIN), SMOLLM2)
    for override, part in [
        ("engine.context_length=4096", "engine KV cache"),
        ("engine.max_batch_size=64", "engine KV cache"),
        ("trainer.micro_batch_tokens=4096", "activations"),
        ("controller.concurrency=64", "process"),
    ]:
        bigger = estimate_memory(main_job(*PLAIN, override), SMOLLM2)
        assert bigger.parts[part] > base.parts[part], override
    checkpointed = estimate_memory(main_job(*PLAIN, "trainer.gradient_checkpointing=true"), SMOLLM2)
    assert checkpointed.parts["activations"] < base.parts["activations"]
    # fp32 weights, gradients and AdamW's two moments: 16 bytes a parameter (2.15 GB for SmolLM2)
    assert base.parts["trainer weights+grads+Adam"] == 16 * SMOLLM2.params


def test_a_kl_reference_costs_a_copy_of_the_weights_except_with_lora():
    """Without LoRA the KL reference is a second fp32 copy (4 bytes a parameter); with LoRA it is the
    policy's own base weights with the adapters off (``TrainablePolicy``'s shared base): nothing more.
    The estimate counted the copy with LoRA too and could refuse a run that fits."""
    trainer = "trainer weights+grads+Adam"
    for lora in ((), ("trainer.lora.r=16",)):
        without = estimate_memory(main_job(*PLAIN, *lora), SMOLLM2).parts[trainer]
        with_kl = estimate_memory(main_job(*PLAIN, *lora, "algorithm.kl_coef=0.05"), SMOLLM2).parts[trainer]
        assert with_kl - without == (0 if lora else 4 * SMOLLM2.params), lora


def test_the_shape_of_a_model_folder_is_read_from_its_config(tmp_path):
    # SmolLM2-135M's config.json: its parameter count is the built-in shape's
    (tmp_path / "config.json").write_text(
        '{"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,'
        ' "vocab_size": 49152, "intermediate_size": 1536, "max_position_embeddings": 8192,'
        ' "tie_word_embeddings": true}'
    )
    assert model_shape(str(tmp_path)) == SMOLLM2
    assert model_shape(str(tmp_path / "missing")) is None
    assert isinstance(model_shape("smollm2"), ModelShape)


SMOLLM2_CONFIG = {
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "intermediate_size": 1536,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_attention_heads", 0),  # was ZeroDivisionError
        ("num_attention_heads", -9),
        ("hidden_size", -576),  # was a negative estimate: any machine "fit"
        ("num_hidden_layers", 0),
        ("vocab_size", 1.5),
        ("intermediate_size", "1536"),
        ("num_key_value_heads", True),
        ("hidden_size", float("inf")),  # json's Infinity: was OverflowError
        ("hidden_size", None),
        ("num_attention_heads", "missing"),
    ],
)
def test_a_config_json_with_no_possible_shape_is_no_estimate_not_a_traceback(tmp_path, field, value):
    """Regression: ``num_attention_heads: 0`` raised ZeroDivisionError out of the preflight (a
    traceback at ``harnessrl train``), Infinity an OverflowError, and a negative size estimated a
    negative amount of memory. No model has such a shape: no estimate (the model's loading names it)."""
    import json

    config = {k: v for k, v in SMOLLM2_CONFIG.items() if not (k == field and value == "missing")}
    if value != "missing":
        config[field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert model_shape(str(tmp_path)) is None
    run = main_job(f'engine.model="{tmp_path}"', 'engine.device="cpu"', 'trainer.device="cpu"')
    assert check_memory(run, available=1) is None


def test_no_check_where_the_engine_is_remote_or_memory_unknown():
    config = main_job()
    assert check_memory(config, available=None) is None
    remote = main_job('engine.model="vllm:http://127.0.0.1:1"', 'trainer.model="smollm2"')
    assert check_memory(remote, available=1) is None


def test_checkpointing_every_other_layer_estimates_between_none_and_all():
    none, half, every = (
        estimate_memory(main_job(*PLAIN, *more), SMOLLM2).parts["activations"]
        for more in (
            (),
            ("trainer.gradient_checkpointing=true", "trainer.gradient_checkpointing_every=2"),
            ("trainer.gradient_checkpointing=true", "trainer.gradient_checkpointing_every=1"),
        )
    )
    assert every < half < none


ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.mark.parametrize(("r", "targets"), [(16, ["q_proj", "v_proj"]), (128, ALL_PROJECTIONS + ["lm_head"])])
def test_the_adapters_counted_are_the_ones_peft_makes(r, targets):
    """The estimate left LoRA's adapters out: at ``r = 128`` on every projection of SmolLM2 their
    weights, gradients and AdamW moments are 0.63 GB, more than the frozen base (0.54 GB), so a run
    that could not fit passed the preflight. Counted here as PEFT counts them, on SmolLM2's real
    architecture (built on the meta device: no weights)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
        vocab_size=49152, intermediate_size=1536, tie_word_embeddings=False,
    )  # fmt: skip
    with torch.device("meta"):
        model = get_peft_model(
            AutoModelForCausalLM.from_config(config), LoraConfig(r=r, target_modules=targets)
        )
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert SMOLLM2.adapter_params(r, targets) == trainable

    trainer = "trainer weights+grads+Adam"
    lora = [f"trainer.lora.r={r}", f"trainer.lora.target_modules={targets}".replace("'", '"')]
    part = estimate_memory(main_job(*PLAIN, *lora), SMOLLM2).parts[trainer]
    assert part == 4 * SMOLLM2.params + 16 * trainable
