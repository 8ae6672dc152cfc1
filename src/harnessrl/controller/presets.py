"""Harness presets: the exact command line and environment that point a known harness at a rollout.

A preset fills in what the user's ``[harness]`` section leaves empty; anything the user sets wins
(``env`` and ``files`` are merged, the user's keys last). Documented in ``docs/harnesses.md``.

Every preset configures its harness through argv and environment only — never through files in
``$HOME`` or the workspace — so the workspace the policy sees (and the evaluator scores) holds
nothing but the task, and nothing has to be written outside it. npm harnesses are looked up in the
project-local prefix that ``install.sh`` fills (``.harnesses/node_modules/.bin``), then on ``PATH``;
Python harnesses next to harnessrl's interpreter, then on ``PATH``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from harnessrl.controller.base import HarnessSpec
from harnessrl.errors import ConfigError


def _venv_bin(name: str) -> str:
    """A console script installed next to this Python (harnessrl's venv), else the bare name (PATH)."""
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else name


# Where install.sh puts the npm harnesses: beside the venv (``<project>/.venv`` ->
# ``<project>/.harnesses``) or in the current folder.
NPM_PREFIX = ".harnesses"


def _npm_prefix() -> Path | None:
    """The project-local npm prefix, if install.sh made one."""
    for root in (Path(sys.prefix).parent, Path.cwd()):
        if (root / NPM_PREFIX / "node_modules").is_dir():
            return root / NPM_PREFIX
    return None


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


# install.sh puts OpenHands (PyPI ``openhands``, Python 3.12, not 3.11 like harnessrl) into its own venv
# inside the npm prefix folder: ``.harnesses/openhands-venv``.
OPENHANDS_VENV = "openhands-venv"


def _venv_mounts(venv: Path) -> list[str]:
    """A venv and the Python install it was made from (``home`` in ``pyvenv.cfg``): what a harness
    in its own venv must be able to read inside the sandbox."""
    mounts = [str(venv.resolve())]
    cfg = venv / "pyvenv.cfg"
    if cfg.is_file():
        for line in cfg.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                mounts.append(str(Path(value.strip()).resolve().parent))
    return mounts


def _openhands_bin() -> str | None:
    """OpenHands from its project-local venv (``.harnesses/openhands-venv/bin``), else from PATH."""
    for root in (Path(sys.prefix).parent, Path.cwd()):
        candidate = root / NPM_PREFIX / OPENHANDS_VENV / "bin" / "openhands"
        if candidate.exists():
            return str(candidate)
    return shutil.which("openhands")


# OpenHands runs its `terminal` tool in tmux (when tmux is installed) on a server with the fixed socket
# name "openhands", i.e. /tmp/tmux-<uid>/openhands, shared by every process of the user. Concurrent
# rollouts would then share one tmux server: the second rollout's commands would run inside the
# first one's sandbox (its network namespace and cgroup) and die with it. The wrapper gives each
# attempt its own TMUX_TMPDIR (short, in /tmp: a socket path must fit in 107 bytes, which an attempt
# folder under a deep run dir does not) and removes it afterwards.
_OPENHANDS_WRAPPER = (
    "d=$(mktemp -d /tmp/harnessrl-openhands.XXXXXX) || exit 1; "
    'TMUX_TMPDIR="$d" "$@"; rc=$?; rm -rf "$d"; exit $rc'
)


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
            "{workspace}/../home/trajectory.json",  # the attempt's home: writable in the sandbox
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
            "{prompt}",
            "--dangerously-skip-permissions",
            "--output-format",
            "json",
            "--model",
            "{model}",
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
    """A config file with fixed content, kept in the npm prefix (else the temp folder); rewritten
    only when its content changed, so concurrent rollouts read a complete file."""
    folder = (_npm_prefix() or Path(tempfile.gettempdir())) / "harnessrl-presets"
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


def openhands() -> HarnessSpec:
    """OpenHands CLI (PyPI ``openhands``, its own Python 3.12 venv): chat completions through litellm,
    not streamed.

    ``--override-with-envs`` builds the agent from ``LLM_MODEL`` / ``LLM_API_KEY`` / ``LLM_BASE_URL``
    (no ``agent_settings.json`` needed: the attempt's ``$HOME/.openhands`` starts empty);
    ``--headless`` auto-approves every action. The CLI runs its tools as local processes in the
    workspace (no runtime container). Started through a small ``sh`` wrapper that gives each attempt
    its own tmux socket folder (see ``_OPENHANDS_WRAPPER``); when OpenHands is not installed the
    command is the bare name, so ``check_harness`` reports it before anything starts."""
    exe = _openhands_bin()
    args = ["--headless", "--override-with-envs", "--json", "-t", "{prompt}"]
    command = ["/bin/sh", "-c", _OPENHANDS_WRAPPER, "openhands", exe, *args] if exe else ["openhands", *args]
    return HarnessSpec(
        command=command,
        env={
            "LLM_MODEL": "openai/{model}",
            "LLM_API_KEY": "{api_key}",
            "LLM_BASE_URL": "{base_url}",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "OPENHANDS_SUPPRESS_BANNER": "1",
        },
        mounts=_venv_mounts(Path(exe).parent.parent) if exe else [],
    )


_SMOLAGENTS_AGENT = """import os, subprocess, sys
from smolagents import OpenAIServerModel, Tool, ToolCallingAgent

class Bash(Tool):  # a Tool subclass: @tool reads the function's source file, and `python -c` has none
    name = "bash"
    description = "Run a shell command in the current folder and return its output and exit status."
    inputs = dict(command=dict(type="string", description="the shell command to run"))
    output_type = "string"

    def forward(self, command):
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=300)
        return (done.stdout + done.stderr)[-20000:] + "\\n[exit status " + str(done.returncode) + "]"

model = OpenAIServerModel(
    model_id=os.environ["HARNESSRL_MODEL"],
    api_base=os.environ["OPENAI_BASE_URL"],
    api_key=os.environ["OPENAI_API_KEY"],
)
agent = ToolCallingAgent(tools=[Bash()], model=model, max_steps=int(os.environ.get("AGENT_MAX_STEPS", "20")))
print(agent.run(sys.argv[1]))
"""

_OPENAI_AGENTS_AGENT = """import os, subprocess, sys
from agents import Agent, Runner, function_tool, set_default_openai_api, set_tracing_disabled

set_tracing_disabled(True)
set_default_openai_api(os.environ.get("OPENAI_AGENTS_API", "responses"))

@function_tool
def bash(command: str) -> str:
    \"\"\"Run a shell command in the current folder and return its output and exit status.\"\"\"
    done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=300)
    return (done.stdout + done.stderr)[-20000:] + "\\n[exit status " + str(done.returncode) + "]"

agent = Agent(
    name="harnessrl",
    instructions="You are a coding agent. Act in the current folder with the bash tool.",
    tools=[bash],
    model=os.environ["HARNESSRL_MODEL"],
)
result = Runner.run_sync(agent, sys.argv[1], max_turns=int(os.environ.get("AGENT_MAX_STEPS", "20")))
print(result.final_output)
"""


def _python_agent(package: str, source: str) -> HarnessSpec:
    """A small reference agent (one ``bash`` tool) on a Python agent library, run with harnessrl's
    interpreter. The library must be importable here; a missing one is a config error, not a
    policy failure of every rollout."""
    if importlib.util.find_spec(package) is None:
        raise ConfigError(
            f"harness.preset: the {package!r} Python package is not installed in harnessrl's "
            f"environment ({sys.executable}); run ./install.sh or pip install it"
        )
    return HarnessSpec(command=[sys.executable, "-c", source, "{prompt}"])


def smolagents() -> HarnessSpec:
    """smolagents ``ToolCallingAgent`` on ``OpenAIServerModel`` (chat completions, not streamed)."""
    return _python_agent("smolagents", _SMOLAGENTS_AGENT)


def openai_agents() -> HarnessSpec:
    """The OpenAI Agents SDK (``openai-agents``): Responses API by default, tracing off;
    ``OPENAI_AGENTS_API=chat_completions`` in ``harness.env`` switches it to chat completions."""
    return _python_agent("agents", _OPENAI_AGENTS_AGENT)


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
        "mounts": [*base.mounts, *(m for m in spec.mounts if m not in base.mounts)],
    }
    return HarnessSpec.model_validate(merged)
