"""``[algorithm]``: no field that silently does nothing. ``tis_cap`` truncates the importance weight of
the trainer proximal and is refused with the behaviour proximal, which has none."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.config import load_raw_config, validate_config
from harnessrl.errors import ConfigError
from harnessrl.trainer.config import TrainConfig


def test_the_default_proximal_is_the_behaviour_policy_without_a_tis_cap():
    config = AlgorithmConfig()
    assert config.proximal == "behaviour" and config.tis_cap is None and config.kl_coef == 0


def test_tis_cap_needs_the_trainer_proximal():
    assert AlgorithmConfig(proximal="trainer", tis_cap=2.0).tis_cap == 2.0
    assert AlgorithmConfig(proximal="trainer").tis_cap is None  # untruncated
    with pytest.raises(ValidationError, match="tis_cap"):
        AlgorithmConfig(tis_cap=2.0)


def test_a_tis_cap_without_effect_is_refused_in_the_run_config():
    with pytest.raises(ConfigError, match=r"algorithm.*tis_cap.*proximal"):
        validate_config(TrainConfig, load_raw_config("examples/tiny/train.toml", ["algorithm.tis_cap=2.0"]))


@pytest.mark.parametrize("field", ["eps", "clip_low", "clip_high", "dual_clip", "tis_cap", "kl_coef"])
@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_a_number_that_is_not_finite_is_refused_naming_the_field(field, value):
    """``kl_coef = inf`` gave a NaN loss on every token (``inf * 0`` where the policy equals the
    reference) and NaN weights after the step; ``eps = inf`` made every advantage 0."""
    overrides = [f"algorithm.{field}={value}"] + (
        ["algorithm.proximal=trainer"] if field == "tis_cap" else []
    )
    with pytest.raises(ConfigError, match=rf"algorithm\.{field}"):
        validate_config(TrainConfig, load_raw_config("examples/tiny/train.toml", overrides))


def test_large_finite_numbers_are_still_accepted():
    config = AlgorithmConfig(
        eps=1e30, clip_high=10.0, dual_clip=1e30, proximal="trainer", tis_cap=1e30, kl_coef=1e30
    )
    assert config.kl_coef == 1e30 and config.tis_cap == 1e30
