"""Presets for the Python harnesses: mini-swe-agent, a user's script, OpenHands, smolagents and the
OpenAI Agents SDK.

They run next to harnessrl's interpreter (its venv's console scripts, else ``PATH``), except
OpenHands, which needs Python 3.12 and gets its own venv inside the project-local prefix
(``.harnesses/openhands-venv``). smolagents and the Agents SDK have no CLI: the preset runs a small
reference agent (one ``bash`` tool) written here. The policy, conventions and merge are in
``presets``.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.presets.npm import project_path
from harnessrl.errors import ConfigError


def _venv_bin(name: str) -> str:
    """A console script installed next to this Python (harnessrl's venv), else the bare name (PATH)."""
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else name


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
    candidate = project_path(OPENHANDS_VENV, "bin", "openhands")
    return str(candidate) if candidate is not None else shutil.which("openhands")


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


def _mini_builtin_config(exe: str) -> str:
    """mini's own ``mini.yaml`` as an absolute path when ``exe`` is the ``mini`` of harnessrl's venv.

    mini looks a bare ``-c mini.yaml`` up in its current folder first — the workspace — and only then
    among its built-in configs: a task whose repository (or ``harness.files``) holds a ``mini.yaml`` at
    its top replaced the preset's whole agent config (system prompt, tools, limits) with it. Another
    ``mini`` (from ``PATH``) keeps the bare name: its built-in folder is not known here."""
    found = importlib.util.find_spec("minisweagent") if exe != "mini" else None  # "mini": from PATH
    if found is not None and found.origin is not None:
        builtin = Path(found.origin).parent / "config" / "mini.yaml"
        if builtin.is_file():
            return str(builtin)
    return "mini.yaml"


def mini_swe_agent() -> HarnessSpec:
    """mini-swe-agent 2.x (``mini``), its default ``mini.yaml`` (a ``bash`` tool), litellm underneath.

    The rollout's key is not in argv (``model.model_kwargs.api_key=…`` was: every local user's ``ps``
    shows a command line): litellm's ``openai/`` provider reads ``OPENAI_API_KEY``, which every harness
    gets in its environment (``harness.render_harness``)."""
    exe = _venv_bin("mini")
    return HarnessSpec(
        command=[
            exe,
            "-y",
            "--exit-immediately",
            "-m",
            "openai/{model}",
            "-c",
            _mini_builtin_config(exe),
            "-c",
            "model.model_kwargs.api_base={base_url}",
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
    # ``--task=`` glues the prompt to its option (argparse splits at the first "="): after a separate
    # "-t", a prompt such as "-v is broken" or "--version" was read as an option of the CLI.
    args = ["--headless", "--override-with-envs", "--json", "--task={prompt}"]
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
