"""Harness presets: the exact command line and environment that point a known harness at a rollout.

A preset fills in what the user's ``[harness]`` section leaves empty; anything the user sets wins
(``env`` and ``files`` are merged, the user's keys last). Documented in ``docs/harnesses.md``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from harnessrl.controller.base import HarnessSpec
from harnessrl.errors import ConfigError


def _venv_bin(name: str) -> str:
    """A console script installed next to this Python (harnessrl's venv), else the bare name (PATH)."""
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else name


def mini_swe_agent() -> HarnessSpec:
    """mini-swe-agent 2.x (``mini``), its default ``mini.yaml`` (a ``bash`` tool), litellm underneath."""
    return HarnessSpec(
        command=[
            _venv_bin("mini"),
            "-y",
            "--exit-immediately",
            "-m",
            "openai/{model}",
            "-c",
            "mini.yaml",
            "-c",
            "model.model_kwargs.api_base={base_url}",
            "-c",
            "model.model_kwargs.api_key={api_key}",
            "-t",
            "{prompt}",
            "-o",
            "{workspace}/../trajectory.json",
        ],
        env={
            "MSWEA_CONFIGURED": "true",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        },
    )


def python_script() -> HarnessSpec:
    """A Python agent script run with harnessrl's interpreter; the user gives the script and its args
    in ``command`` (e.g. ``["agent.py", "{prompt}"]``) and the preset prepends the interpreter."""
    return HarnessSpec(command=[sys.executable])


PRESETS: dict[str, Callable[[], HarnessSpec]] = {
    "mini-swe-agent": mini_swe_agent,
    "python": python_script,
}


def apply_preset(spec: HarnessSpec) -> HarnessSpec:
    if spec.preset is None:
        return spec
    if spec.preset not in PRESETS:
        raise ConfigError(f"harness.preset: unknown preset {spec.preset!r}; known: {sorted(PRESETS)}")
    base = PRESETS[spec.preset]()
    user = spec.model_dump(exclude_unset=True)
    command = base.command + spec.command if spec.preset == "python" else spec.command or base.command
    merged = {
        **base.model_dump(),
        **user,
        "command": command,
        "env": {**base.env, **spec.env},
        "files": {**base.files, **spec.files},
    }
    return HarnessSpec.model_validate(merged)
