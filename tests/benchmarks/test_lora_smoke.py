"""Smoke test of ``benchmarks/lora.py``: one trainer point of each kind on the tiny model (not a
timed test): LoRA trains a small fraction of the parameters with a matching AdamW state, and the
embedded publish hands over fewer bytes with LoRA than a full update."""

from __future__ import annotations

import argparse
from types import ModuleType

import pytest
from tests.benchmarks.scripts import load_benchmark

from harnessrl.engines.tiny import tiny_model_dir


@pytest.fixture(scope="module")
def lora() -> ModuleType:
    return load_benchmark("lora")


def settings() -> argparse.Namespace:
    return argparse.Namespace(
        model="tiny", model_dir=str(tiny_model_dir()), ranks=[4], samples=2, prompt_tokens=8,
        completion_tokens=8, steps=1, repeat=1, new_tokens=2,
    )  # fmt: skip


def test_a_lora_point_trains_a_fraction_of_the_parameters(lora: ModuleType) -> None:
    full = lora.trainer_point(settings(), None)
    adapter = lora.trainer_point(settings(), 4)
    assert full["variant"] == "full" and adapter["variant"] == "lora r=4"
    assert 0 < adapter["trainable_params"] < full["trainable_params"] / 10
    # AdamW keeps two fp32 moments per trainable parameter (plus a step count each)
    assert adapter["optimizer_state_bytes"] >= 8 * adapter["trainable_params"]
    assert full["tokens_per_step"] == adapter["tokens_per_step"] == 2 * 16


def test_the_embedded_publish_of_lora_hands_over_only_the_adapted_layers(lora: ModuleType) -> None:
    out = lora.run_embedded(settings())
    assert out["lora_bytes"] < out["full_bytes"] and out["bytes_ratio_full_over_lora"] > 1
    assert out["generate_tokens"] == 4 * 2
