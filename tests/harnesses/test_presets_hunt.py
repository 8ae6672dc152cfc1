"""Presets against inputs a task or a setup really has: a prompt that looks like an option, a task
repository holding a ``mini.yaml``, a ``python`` preset without a script, harnesses installed where
this user cannot write.

The Hermes cases run Hermes's own argument parser (and one real rollout through ``harnessrl
rollout``: sandbox, gateway, scripted engine); the mini-swe-agent case runs mini's own config lookup
in the workspace. Each skips when its harness is not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.harness import render_harness
from harnessrl.controller.presets import PRESETS, apply_preset
from harnessrl.errors import ConfigError
from harnessrl.schemas import Rollout
from harnessrl.store.sqlite import SQLiteStore

BASE_URL = "http://127.0.0.1:9/rollouts/r-1/v1"
ANTHROPIC_URL = "http://127.0.0.1:9/rollouts/r-1"

# Prompts a task may well have: each starts with something an argument parser takes for an option
# (a known short flag with text glued on, a known long flag, an "=" right after the option).
OPTION_LIKE_PROMPTS = [
    "-m is ignored by the parser: fix it",
    "-t fails on empty input",
    "--version",
    "--help",
    "-v",
    '=x "quoted" $(id) `id` \n second line',
]


def rendered_argv(preset: str, prompt: str, tmp_path: Path) -> list[str]:
    spec = apply_preset(HarnessSpec(preset=preset, model_name="my-policy"))
    rollout = Rollout(rollout_id="r-1", api_key="hrl-secret", task={"prompt": prompt})
    workspace = tmp_path / "ws"
    return render_harness(
        spec, rollout=rollout, workspace=workspace, base_url=BASE_URL, anthropic_base_url=ANTHROPIC_URL
    ).argv


def hermes_or_skip() -> list[str]:
    command = PRESETS["hermes"]().command
    if command[0] == "hermes":
        pytest.skip("Hermes Agent is not installed (./install.sh puts it in .harnesses/hermes-venv)")
    return command


def refused_at_start(tmp_path: Path, harness: str, named: str) -> None:
    """``harnessrl rollout`` of a config whose ``[harness]`` section is ``harness`` (a scripted
    engine, ``true`` as evaluator) exits 2 naming ``named``, with no traceback and no run folder."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": ["Done."]}))
    config = tmp_path / "rollout.toml"
    config.write_text(
        f'[engine]\nmodel = "scripted:{script}"\n\n[harness]\n{harness}\n'
        '[evaluator]\ntype = "command"\ncommand = ["true"]\n\n[task]\nprompt = "hi"\n'
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harnessrl",
            "rollout",
            "--config",
            str(config),
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert named in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("prompt", OPTION_LIKE_PROMPTS)
def test_hermes_takes_an_option_like_prompt_as_its_prompt(prompt, tmp_path):
    command = hermes_or_skip()
    exe = Path(command[4])  # [/bin/sh, -c, wrapper, config, hermes, <hermes's arguments>...]
    argv = rendered_argv("hermes", prompt, tmp_path)
    # Hermes's own top-level parser, in its own venv: what `hermes` makes of the preset's arguments.
    probe = (
        "import json, sys\n"
        "from hermes_cli._parser import build_top_level_parser\n"
        "parser = build_top_level_parser()[0]\n"
        "args = parser.parse_args(sys.argv[1:])\n"
        "print(json.dumps([args.oneshot, args.model, args.provider]))\n"
    )
    done = subprocess.run(
        [str(exe.parent / "python"), "-c", probe, *argv[5:]],
        capture_output=True,
        text=True,
        timeout=120,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [prompt, "my-policy", "custom"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")
def test_hermes_rollout_with_an_option_like_prompt_reaches_the_model_verbatim(tmp_path):
    hermes_or_skip()
    prompt = OPTION_LIKE_PROMPTS[0] + "\n" + OPTION_LIKE_PROMPTS[-1]
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": ["Done."], "on_exhausted": "repeat_last"}))
    config = tmp_path / "rollout.toml"
    config.write_text(
        f"""
[engine]
model = "scripted:{script}"
context_length = 262144

[harness]
preset = "hermes"
timeout_s = 180

[harness.limits]
memory_mb = 8192
max_processes = 1024

[evaluator]
type = "command"
command = ["true"]

[controller]
max_infra_retries = 0
"""
    )
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "harnessrl", "rollout", "--config", str(config)]
        + ["--task", json.dumps({"prompt": prompt}), "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    stderr = (Path(summary["log"]) / "stderr.log").read_text()[-2000:]
    # Before: Hermes exited 2 ("-z/--oneshot: expected one argument"), no call, policy_failure.
    assert summary["outcome"] == "success" and summary["calls"] == 1, f"{summary}\n{stderr}"
    store = SQLiteStore(run_dir / "harnessrl.db")
    try:
        [call] = store.list_calls(summary["rollout_id"])
    finally:
        store.close()
    users = [m["content"] for m in call.request["messages"] if m["role"] == "user"]
    assert users == [prompt]


@pytest.mark.parametrize("prompt", OPTION_LIKE_PROMPTS)
def test_openhands_task_option_holds_the_whole_prompt(prompt, tmp_path):
    argv = rendered_argv("openhands", prompt, tmp_path)
    at = argv.index("--headless")
    # The options of OpenHands CLI 1.16's top-level argparse parser (openhands_cli/argparsers/
    # main_parser.py) that the preset's arguments and a prompt can meet.
    parser = argparse.ArgumentParser(prog="openhands", exit_on_error=False)
    parser.add_argument("--version", "-v", action="store_true")
    parser.add_argument("-t", "--task", type=str)
    parser.add_argument("-f", "--file", type=str)
    for flag in ("--headless", "--override-with-envs", "--json", "--exp", "--last"):
        parser.add_argument(flag, action="store_true")
    args, rest = parser.parse_known_args(argv[at:])
    assert args.task == prompt and not args.version and rest == []


def test_mini_swe_agent_uses_its_own_config_not_a_mini_yaml_in_the_workspace(tmp_path):
    argv = rendered_argv("mini-swe-agent", "make hello.txt", tmp_path)
    if argv[0] == "mini":
        pytest.skip("mini-swe-agent is not installed in harnessrl's venv")
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    # A task repository with a mini.yaml at its top (the harness starts in the workspace).
    (workspace / "mini.yaml").write_text("agent:\n  system_template: 'not the preset'\n")
    configs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-c"]
    probe = (
        "import sys\n"
        "from minisweagent.config import builtin_config_dir, get_config_path\n"
        "print(get_config_path(sys.argv[1]).resolve(), (builtin_config_dir / 'mini.yaml').resolve())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, configs[0]],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MSWEA_SILENT_STARTUP": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    used, builtin = done.stdout.split()[-2:]
    assert used == builtin, f"mini read {used}"


def test_python_preset_without_a_script_is_a_config_error_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"harness\.command"):
        apply_preset(HarnessSpec(preset="python"))
    assert apply_preset(HarnessSpec(preset="python", command=["./agent.py"])).command[1:] == ["./agent.py"]

    # Through the CLI: exit 2 naming the field, no run folder made. Before: Python read an empty
    # stdin, exit 0, outcome "success" with no call made.
    refused_at_start(tmp_path, 'preset = "python"\ntimeout_s = 30\n', "harness.command")


def test_a_harnesses_folder_that_cannot_be_written_keeps_the_config_file_in_the_private_folder(
    tmp_path, monkeypatch
):
    # Harnesses installed where this user cannot write: a file where the config folder would go
    # stands in for a read-only install (root writes through file modes).
    installed = tmp_path / "installed"
    (installed / "node_modules").mkdir(parents=True)
    (installed / "harnessrl-presets").write_text("not a folder")
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("HARNESSRL_HARNESSES_DIR", str(installed))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    spec = apply_preset(HarnessSpec(preset="qwen-code"))  # before: FileExistsError (a traceback)
    settings = Path(spec.env["QWEN_CODE_SYSTEM_SETTINGS_PATH"])
    assert settings.parent == temp / f"harnessrl-presets-{os.geteuid()}"
    assert json.loads(settings.read_text())["telemetry"]["enabled"] is False
    assert str(settings) in spec.mounts


@pytest.mark.parametrize("name", ["A=B", ""])
def test_an_env_key_that_is_no_variable_name_is_a_config_error_naming_it(name, tmp_path):
    spec = apply_preset(HarnessSpec(preset="python", command=["-c", "pass"], env={name: "x"}))
    rollout = Rollout(rollout_id="r-1", api_key="hrl-secret", task={"prompt": "hi"})
    with pytest.raises(ConfigError, match=r"harness\.env\..*no environment variable name"):
        render_harness(
            spec,
            rollout=rollout,
            workspace=tmp_path / "ws",
            base_url=BASE_URL,
            anthropic_base_url=ANTHROPIC_URL,
        )

    # Through the CLI: exit 2 naming the field, no run folder. Before: bubblewrap's setenv failed, so
    # every attempt was an infrastructure failure ("bwrap failed to set up the sandbox"), retried.
    harness = f'preset = "python"\ncommand = ["-c", "pass"]\ntimeout_s = 30\n\n[harness.env]\n{json.dumps(name)} = "x"\n'
    refused_at_start(tmp_path, harness, "harness.env.")


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")
def test_openclaw_runs_its_tools_in_harness_workdir(tmp_path):
    if PRESETS["openclaw"]().command[0] == "openclaw":
        pytest.skip("OpenClaw is not installed (./install.sh puts it in .harnesses/openclaw)")
    shell = {"name": "exec", "arguments": {"command": "pwd > /rollout/workspace/where.txt"}}
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"content": "Next.", "tool_calls": [shell]}, "Done."]}))
    config = tmp_path / "rollout.toml"
    config.write_text(
        f"""
[engine]
model = "scripted:{script}"
context_length = 262144

[harness]
preset = "openclaw"
timeout_s = 180
workdir = "sub"

[harness.files]
"sub/keep.txt" = "x"

[harness.limits]
memory_mb = 8192
max_processes = 1024

[evaluator]
type = "command"
command = ["true"]

[controller]
max_infra_retries = 0
"""
    )
    proc = subprocess.run(
        [sys.executable, "-m", "harnessrl", "rollout", "--config", str(config)]
        + ["--task", json.dumps({"prompt": "Where are you?"}), "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    log = Path(summary["log"])
    assert summary["calls"] == 2, f"{summary}\n{(log / 'stderr.log').read_text()[-2000:]}"
    # Before: "--cwd {workspace}" put OpenClaw's tools at the workspace's top, not in harness.workdir.
    assert (log / "workspace" / "where.txt").read_text() == "/rollout/workspace/sub\n"
