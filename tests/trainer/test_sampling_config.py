"""``[trainer] top_p``: forced to 1 by default, opt out with "harness", anything else outside (0, 1] refused."""

from __future__ import annotations

import pytest

from harnessrl.config import load_raw_config, validate_config
from harnessrl.errors import ConfigError
from harnessrl.trainer.config import TrainConfig

TINY = "examples/tiny/train.toml"


def config(*overrides: str) -> TrainConfig:
    return validate_config(TrainConfig, load_raw_config(TINY, list(overrides)))


def test_training_rollouts_sample_the_full_distribution_by_default() -> None:
    assert config().trainer.top_p == 1.0


def test_harness_lets_the_harness_top_p_through() -> None:
    assert config('trainer.top_p="harness"').trainer.top_p == "harness"


@pytest.mark.parametrize("value", ["0", "1.5", "-0.1", '"nucleus"'])
def test_a_bad_top_p_names_the_field(value: str) -> None:
    with pytest.raises(ConfigError, match="trainer.top_p"):
        config(f"trainer.top_p={value}")
