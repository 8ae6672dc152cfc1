"""A ``harnessrl rollout`` config on the scripted engine, as the tests that run the real command write
it (here, and the red-team attacks of tests/redteam that share their shape)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: A script for a harness that never calls the model (a probe or an attacker runs on its own).
UNUSED_TURNS: list[dict[str, Any]] = [{"content": "unused"}]


def scripted_rollout_config(
    folder: Path, name: str, sections: str, turns: list[dict[str, Any]] = UNUSED_TURNS
) -> Path:
    """``folder/name``: a rollout config whose ``[engine]`` plays ``turns`` (written to
    ``folder/script.json``), followed by ``sections`` (TOML: the harness, evaluator, controller...)."""
    script = folder / "script.json"
    script.write_text(json.dumps({"turns": turns}))
    config = folder / name
    config.write_text(f'\n[engine]\nmodel = "scripted:{script}"\n' + sections)
    return config
