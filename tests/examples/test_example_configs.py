"""Every shipped training config a person runs to watch learning writes TensorBoard logs (the
documented default); only the tiny config the tests run many times turns it off."""

from __future__ import annotations

import tomllib
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_examples_write_tensorboard_logs():
    configs = sorted(EXAMPLES.glob("*/train*.toml"))
    assert len(configs) >= 6
    for path in configs:
        metrics = tomllib.loads(path.read_text()).get("metrics", {})
        expected = path.parent.name != "tiny"
        assert metrics.get("tensorboard", True) is expected, path
