"""Harness presets: the exact command line and environment that point a known harness at a rollout.

A preset fills in what the user's ``[harness]`` section leaves empty; anything the user sets wins
(``env`` and ``files`` are merged, the user's keys last). Documented in ``docs/harnesses.md``.

Every preset configures its harness through argv and environment only — never through files in
``$HOME`` or the workspace — so the workspace the policy sees (and the evaluator scores) holds
nothing but the task, and nothing has to be written outside it. npm harnesses are looked up in the
project-local prefix that ``install.sh`` fills (``.harnesses/node_modules/.bin``), then on ``PATH``;
Python harnesses next to harnessrl's interpreter, then on ``PATH``.

This module is the registry (``PRESETS``) and the merge (``apply_preset``); the presets themselves
are in ``presets_npm`` (Claude Code, Codex, OpenCode, Qwen Code) and ``presets_python``
(mini-swe-agent, ``python``, OpenHands, smolagents, the OpenAI Agents SDK) and ``presets_assistants``
(the general-purpose assistants Hermes Agent and OpenClaw, which insist on a config file: a fixed one
per machine that reads the rollout from the environment).
"""

from __future__ import annotations

from collections.abc import Callable

from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.presets_assistants import hermes, openclaw
from harnessrl.controller.presets_npm import claude_code, codex, opencode, qwen_code
from harnessrl.controller.presets_python import (
    mini_swe_agent,
    openai_agents,
    openhands,
    python_script,
    smolagents,
)
from harnessrl.errors import ConfigError

PRESETS: dict[str, Callable[[], HarnessSpec]] = {
    "mini-swe-agent": mini_swe_agent,
    "python": python_script,
    "claude-code": claude_code,
    "codex": codex,
    "opencode": opencode,
    "qwen-code": qwen_code,
    "openhands": openhands,
    "smolagents": smolagents,
    "openai-agents": openai_agents,
    "hermes": hermes,
    "openclaw": openclaw,
}


def apply_preset(spec: HarnessSpec) -> HarnessSpec:
    """``spec`` filled in from its preset: the user's fields win, ``env``/``files`` merge (the user's
    keys last), ``mounts`` add up; the ``python`` preset prepends its interpreter to ``command``."""
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
        "mounts": [*base.mounts, *(m for m in spec.mounts if m not in base.mounts)],
    }
    return HarnessSpec.model_validate(merged)
