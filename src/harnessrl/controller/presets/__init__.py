"""Harness presets: the exact command line and environment that point a known harness at a rollout.

A preset fills in what the user's ``[harness]`` section leaves empty; anything the user sets wins
(``env`` and ``files`` are merged, the user's keys last). Documented in ``docs/harnesses.md``.

Every preset configures its harness through argv and environment only — never through files in
``$HOME`` or the workspace — so the workspace the policy sees (and the evaluator scores) holds
nothing but the task, and nothing has to be written outside it. npm harnesses are looked up in the
project-local prefix that ``install.sh`` fills (``.harnesses/node_modules/.bin``), then on ``PATH``;
Python harnesses next to harnessrl's interpreter, then on ``PATH``.

This package's ``__init__`` is the registry (``PRESETS``) and the merge (``apply_preset``); the
presets themselves are in ``npm`` (Claude Code, Codex, OpenCode, Qwen Code), ``python``
(mini-swe-agent, ``python``, OpenHands, smolagents, the OpenAI Agents SDK) and ``assistants``
(the general-purpose assistants Hermes Agent and OpenClaw, which insist on a config file: a fixed one
per machine that reads the rollout from the environment).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.presets.assistants import hermes, openclaw
from harnessrl.controller.presets.npm import (
    END_OF_OPTIONS,
    claude_code,
    codex,
    opencode,
    project_path,
    qwen_code,
)
from harnessrl.controller.presets.python import (
    mini_swe_agent,
    openai_agents,
    openhands,
    python_script,
    smolagents,
)
from harnessrl.errors import ConfigError
from harnessrl.retrieval import harness_tools
from harnessrl.sandbox.bwrap import DEFAULT_PATH

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
    keys last), ``mounts`` add up; the ``python`` preset prepends its interpreter to ``command``.
    A preset's own command that ends its options with ``--`` (before ``{prompt}``) gets
    ``harness.args`` just before the ``--``: after it they would be read as part of the prompt."""
    if spec.preset is None:
        return add_tools(spec)
    if spec.preset not in PRESETS:
        raise ConfigError(f"harness.preset: unknown preset {spec.preset!r}; known: {sorted(PRESETS)}")
    if spec.preset == "python" and not spec.command and not spec.args:
        # [python] alone read an empty stdin and exited 0: every rollout "succeeded" with no call made.
        raise ConfigError(
            'harness.command: the python preset runs your agent script: set command = ["./agent.py", '
            '"{prompt}"] (the preset puts harnessrl\'s Python in front)'
        )
    base = PRESETS[spec.preset]()
    user = spec.model_dump(exclude_unset=True)
    command = base.command + spec.command if spec.preset == "python" else spec.command or base.command
    args = spec.args
    if not spec.command and END_OF_OPTIONS in command:
        at = command.index(END_OF_OPTIONS)
        command, args = [*command[:at], *args, *command[at:]], []
    merged = {
        **base.model_dump(),
        **user,
        "command": command,
        "args": args,
        "env": {**base.env, **spec.env},
        "files": {**base.files, **spec.files},
        "mounts": [*base.mounts, *(m for m in spec.mounts if m not in base.mounts)],
    }
    return add_tools(HarnessSpec.model_validate(merged))


def _mcp_claude_code(command: list[str], argv: list[str]) -> list[str]:
    # --mcp-config takes several values: --strict-mcp-config (no other MCP servers) ends the list.
    config = {"mcpServers": {harness_tools.MCP_NAME: {"type": "stdio", "command": argv[0], "args": argv[1:]}}}
    at = _options_end(command, after_prompt=True)
    return [*command[:at], "--mcp-config", json.dumps(config), "--strict-mcp-config", *command[at:]]


def _mcp_codex(command: list[str], argv: list[str]) -> list[str]:
    key = f"mcp_servers.{harness_tools.MCP_NAME}"
    overrides = ["-c", f"{key}.command={json.dumps(argv[0])}", "-c", f"{key}.args={json.dumps(argv[1:])}"]
    at = _options_end(command, after_prompt=False)
    return [*command[:at], *overrides, *command[at:]]


def _options_end(command: list[str], *, after_prompt: bool) -> int:
    """Where options may be added to ``command``: at its ``--`` (the presets' layout, ``… -- {prompt}``),
    else right after (or before) ``{prompt}`` in a user's own layout without one."""
    prompt = command.index("{prompt}")
    if prompt > 0 and command[prompt - 1] == END_OF_OPTIONS:
        return prompt - 1
    return prompt + 1 if after_prompt else prompt


def _mcp_opencode(env: dict[str, str], argv: list[str]) -> dict[str, str]:
    try:  # the user's own (harness.env wins over the preset's): a traceback when it was no JSON object
        config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    except json.JSONDecodeError as exc:
        config = exc
    if not isinstance(config, dict):
        raise ConfigError(
            "harness.env.OPENCODE_CONFIG_CONTENT: not a JSON object, so the search tool's MCP server "
            f'cannot be added to it (harness.tools = ["search"]): {config}'
        )
    config["mcp"] = {harness_tools.MCP_NAME: {"type": "local", "command": argv, "enabled": True}}
    return {**env, "OPENCODE_CONFIG_CONTENT": json.dumps(config)}


def add_tools(spec: HarnessSpec) -> HarnessSpec:
    """``spec`` with the tools ``harness.tools`` names (docs/retrieval.md). ``"search"``: the ``search``
    command first on ``PATH`` for every harness, and for the tool-calling harnesses that take MCP
    servers from their own flags or config (Claude Code, Codex, OpenCode) the MCP server too. The
    sandbox binds the tools' files read-only, nothing else of the project."""
    if "search" not in spec.tools:
        return spec
    bin_dir = harness_tools.search_bin_dir(project_path())  # .harnesses/, else the temp folder
    path = spec.env.get("PATH") or os.environ.get("PATH") or DEFAULT_PATH
    env = {**spec.env, "PATH": f"{bin_dir}:{path}"}
    command, argv = list(spec.command), harness_tools.mcp_server_argv()
    if spec.preset == "claude-code" and "{prompt}" in command:
        command = _mcp_claude_code(command, argv)
        # In -p mode Claude Code connects MCP servers in the background and its first call may go out
        # before the tool is listed; "false" makes it wait for the connection first.
        env.setdefault("MCP_CONNECTION_NONBLOCKING", "false")
    elif spec.preset == "codex" and "{prompt}" in command:
        command = _mcp_codex(command, argv)
    elif spec.preset == "opencode" and "OPENCODE_CONFIG_CONTENT" in env:
        env = _mcp_opencode(env, argv)
    mounts = [*spec.mounts, *(m for m in harness_tools.tool_mounts(bin_dir) if m not in spec.mounts)]
    return spec.model_copy(update={"command": command, "env": env, "mounts": mounts})
