"""Presets for the npm harnesses: Claude Code, Codex, OpenCode and Qwen Code.

Each is looked up in the project-local npm prefix that ``install.sh`` fills
(``.harnesses/node_modules/.bin``), then on ``PATH``, and gets that prefix mounted read-only in its
sandbox. Each is configured through argv and environment only (the policy, conventions and merge
are in ``presets``); Qwen Code, which reads some switches only from a settings file, gets a static
one kept in the prefix, not in ``$HOME`` or the workspace.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from harnessrl.controller.base import HarnessSpec
from harnessrl.errors import ConfigError
from harnessrl.sandbox.host import private_temp_folder

# Ends a harness's options: the prompt after it is an argument even when it starts with "-". Without
# it a task prompt such as "- fix the parser" or "--version" was parsed as a flag: the harness
# refused it (exit 2, reward 0 as the policy's fault) or printed its version and exited 0 untouched.
# ``apply_preset`` puts ``harness.args`` before it.
END_OF_OPTIONS = "--"

# Where install.sh puts the npm harnesses: beside the venv (``<project>/.venv`` ->
# ``<project>/.harnesses``) or in the current folder.
NPM_PREFIX = ".harnesses"


def project_path(*parts: str) -> Path | None:
    """``<harnesses>/<parts>`` if install.sh made it. ``<harnesses>`` is ``$HARNESSRL_HARNESSES_DIR``
    when set (harnesses installed elsewhere; nothing else is looked at then), else ``.harnesses/`` of
    the project (the folder holding harnessrl's venv) or of the current folder. Every preset finds its
    harness through this."""
    configured = os.environ.get("HARNESSRL_HARNESSES_DIR")
    roots = (
        [Path(configured)]
        if configured
        else [root / NPM_PREFIX for root in (Path(sys.prefix).parent, Path.cwd())]
    )
    for root in roots:
        candidate = root.joinpath(*parts)
        if candidate.exists():
            return candidate
    return None


def _npm_prefix() -> Path | None:
    """The project-local npm prefix, if install.sh made one."""
    modules = project_path("node_modules")
    return modules.parent if modules is not None and modules.is_dir() else None


def _npm_mounts() -> list[str]:
    """What an npm harness must be able to read inside the sandbox: the project-local prefix."""
    prefix = _npm_prefix()
    return [str(prefix.resolve())] if prefix is not None else []


def _npm_bin(name: str) -> str:
    """An npm harness from the project-local prefix, else the bare name (resolved on PATH)."""
    prefix = _npm_prefix()
    if prefix is not None and (prefix / "node_modules" / ".bin" / name).exists():
        return str(prefix / "node_modules" / ".bin" / name)
    return name


def claude_code() -> HarnessSpec:
    """Claude Code (npm ``@anthropic-ai/claude-code``): Anthropic Messages, always streamed.

    The rollout's ``ANTHROPIC_BASE_URL`` / ``ANTHROPIC_API_KEY`` come from the controller; the model
    name is passed for every role (main, "haiku" background, subagents) so no call names a model
    the gateway would not serve, and background calls (titles, summaries) are switched off.
    ``IS_SANDBOX=1`` lets ``--dangerously-skip-permissions`` run as root (we are in a sandbox)."""
    return HarnessSpec(
        command=[
            _npm_bin("claude"),
            "-p",
            "--dangerously-skip-permissions",
            "--output-format",
            "json",
            "--model",
            "{model}",
            END_OF_OPTIONS,
            "{prompt}",
        ],
        env={
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_NON_ESSENTIAL_MODEL_CALLS": "1",
            "IS_SANDBOX": "1",
            "ANTHROPIC_MODEL": "{model}",
            "ANTHROPIC_SMALL_FAST_MODEL": "{model}",
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": "{model}",
            "ANTHROPIC_DEFAULT_SONNET_MODEL": "{model}",
            "ANTHROPIC_DEFAULT_OPUS_MODEL": "{model}",
            "CLAUDE_CODE_SUBAGENT_MODEL": "{model}",
        },
        mounts=_npm_mounts(),
    )


def codex() -> HarnessSpec:
    """Codex CLI (npm ``@openai/codex``): OpenAI Responses only, always streamed.

    The provider is defined with ``-c`` overrides (TOML values) instead of ``~/.codex/config.toml``,
    so nothing is written into the attempt's ``$HOME``; ``env_key`` makes Codex send the rollout key
    from ``OPENAI_API_KEY``. A custom provider id and model name keep Codex off OpenAI's own
    request format (the built-in ``openai`` provider with a known model uses other endpoints)."""
    return HarnessSpec(
        command=[
            _npm_bin("codex"),
            "exec",
            "--dangerously-bypass-approvals-and-sandbox",
            "--skip-git-repo-check",
            "-m",
            "{model}",
            "-c",
            'model_provider="harnessrl"',
            "-c",
            'model_providers.harnessrl.name="harnessrl"',
            "-c",
            'model_providers.harnessrl.base_url="{base_url}"',
            "-c",
            'model_providers.harnessrl.env_key="OPENAI_API_KEY"',
            "-c",
            'model_providers.harnessrl.wire_api="responses"',
            "-c",
            'approval_policy="never"',
            "-c",
            "analytics.enabled=false",
            "-c",
            "feedback.enabled=false",
            "-c",
            "check_for_update_on_startup=false",
            "-c",
            'web_search="disabled"',
            "--disable",
            "plugins",
            "--disable",
            "remote_plugin",
            "--disable",
            "apps",
            "--disable",
            "in_app_updates",
            "--disable",
            "goals",
            "--disable",
            "multi_agent",
            END_OF_OPTIONS,
            "{prompt}",
        ],
        env={"RUST_LOG": "error"},
        mounts=_npm_mounts(),
    )


def opencode() -> HarnessSpec:
    """OpenCode (npm ``opencode-ai``): chat completions through ``@ai-sdk/openai-compatible``, streamed.

    The whole config (a ``harnessrl`` provider whose ``baseURL`` is the rollout) is passed in
    ``OPENCODE_CONFIG_CONTENT``; ``--pure`` skips external plugins (which OpenCode would otherwise
    install from npm at start-up — impossible, and pointless, inside the sandbox)."""
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "harnessrl": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "harnessrl",
                "options": {"baseURL": "{base_url}", "apiKey": "{api_key}"},
                "models": {"{model}": {"name": "{model}", "tool_call": True}},
            }
        },
        "model": "harnessrl/{model}",
        "small_model": "harnessrl/{model}",
        "autoupdate": False,
        "share": "disabled",
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
    }
    return HarnessSpec(
        command=[
            _npm_bin("opencode"),
            "run",
            "--pure",
            "--title",
            "harnessrl",
            "-m",
            "harnessrl/{model}",
            END_OF_OPTIONS,
            "{prompt}",
        ],
        env={
            "OPENCODE_CONFIG_CONTENT": json.dumps(config),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_CLAUDE_CODE": "1",
        },
        mounts=_npm_mounts(),
    )


# Qwen Code reads its switches only from settings files. Written once per machine (static content,
# no rollout data) and passed as the *system* settings file, which overrides user and project files.
QWEN_SETTINGS = {
    "$version": 4,  # the current schema: an older one makes Qwen Code migrate (rewrite) the file
    "general": {"enableAutoUpdate": False},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False},
}


def _static_config_file(name: str, content: str) -> str:
    """A config file with fixed content, kept in the npm prefix (else a private folder of this user's
    in the temp folder, ``sandbox.host.private_temp_folder``); rewritten only when its content changed, so
    concurrent rollouts read a complete file. A prefix this user cannot write (harnesses installed
    read-only elsewhere, ``$HARNESSRL_HARNESSES_DIR``) is passed over for the private folder: it raised
    ``OSError`` (a traceback, exit 1) from every command that applied the preset."""
    prefix = _npm_prefix()
    if prefix is not None:
        try:
            return _write_fixed(prefix / "harnessrl-presets", name, content)
        except OSError:
            pass
    folder = private_temp_folder(
        "harnessrl-presets",
        field="harness.preset",
        remedy="remove it, or install the harnesses (install.sh) so their config files live in .harnesses/",
    )
    try:
        return _write_fixed(folder, name, content)
    except OSError as exc:
        raise ConfigError(
            f"harness.preset: cannot write the preset's config file {folder / name}: {exc}"
        ) from exc


def _write_fixed(folder: Path, name: str, content: str) -> str:
    path = folder / name
    if not path.is_file() or path.read_text() != content:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(content)
        tmp.replace(path)
    return str(path)


def qwen_code() -> HarnessSpec:
    """Qwen Code (npm ``@qwen-code/qwen-code``): chat completions, streamed; reads the controller's
    ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` with ``--auth-type openai``. Its background
    "auto-memory" extraction call (a second, unrelated conversation per run) is switched off."""
    settings = _static_config_file("qwen-code-settings.json", json.dumps(QWEN_SETTINGS, indent=2))
    return HarnessSpec(
        command=[
            _npm_bin("qwen"),
            "--auth-type",
            "openai",
            "--yolo",
            "--telemetry=false",
            "-o",
            "json",
            "-m",
            "{model}",
            # Not after "--": Qwen Code (yargs) then leaves the prompt out of its query and waits on
            # stdin. A prompt that starts with "-" is read as a flag here (docs/harnesses.md).
            "{prompt}",
        ],
        env={
            "OPENAI_MODEL": "{model}",
            "QWEN_CODE_SYSTEM_SETTINGS_PATH": settings,
            "QWEN_CODE_NO_RELAUNCH": "1",
            "QWEN_CODE_DISABLE_PRECONNECT": "1",
        },
        mounts=sorted({*_npm_mounts(), settings}),
    )
