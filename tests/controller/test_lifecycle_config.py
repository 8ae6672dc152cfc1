"""Controller settings that parse but cannot work are refused where the config is read: a non-finite
``poll_interval_s`` (``inf``, which ``gt=0`` let through) slept forever after the rollout finished."""

from __future__ import annotations

import pytest

from harnessrl.config import validate_config
from harnessrl.controller.stack import RolloutConfig
from harnessrl.errors import ConfigError

HARNESS = {"command": ["true"]}


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("field", [("poll_interval_s",), ("audit", "max_seconds")])
def test_non_finite_controller_floats_are_refused_naming_the_field(field, value):
    setting: dict = {field[-1]: value}
    if len(field) == 2:
        setting = {field[0]: setting}
    with pytest.raises(ConfigError, match=".".join(("controller", *field))):
        validate_config(RolloutConfig, {"harness": HARNESS, "controller": setting})


def test_finite_controller_floats_are_accepted():
    """Control: the same fields with finite values load."""
    config = validate_config(
        RolloutConfig,
        {"harness": HARNESS, "controller": {"poll_interval_s": 0.25, "audit": {"max_seconds": 30}}},
    )
    assert config.controller.poll_interval_s == 0.25 and config.controller.audit.max_seconds == 30
