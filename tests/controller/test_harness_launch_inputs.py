"""What a task can put into a harness's launch: a prompt that starts with "-" reaches the harness as
its prompt (not a flag), and a task field no command line, environment or path can hold — a NUL
byte, a lone surrogate, more bytes than Linux lets one argument be — is refused naming the field
instead of adding options to bubblewrap, hanging the controller, or failing every attempt as a
sandbox failure; ``harnessrl rollout`` refuses such a task before it creates anything."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.controller.base import ROLLOUT_PATHS, HarnessSpec
from harnessrl.controller.harness import render_harness
from harnessrl.controller.presets import PRESETS, apply_preset
from harnessrl.errors import ConfigError
from harnessrl.schemas import Rollout
from harnessrl.store.sqlite import SQLiteStore

HARNESSRL = [sys.executable, "-m", "harnessrl"]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")
# The presets whose harness takes the prompt as a positional argument and ends its options with "--".
DASHED = ["claude-code", "codex", "opencode", "openclaw"]
# Linux's MAX_ARG_STRLEN (32 pages) less the terminating NUL: the longest argument an exec takes.
MAX_EXEC_STRING = 32 * os.sysconf("SC_PAGESIZE") - 1


def render(spec: HarnessSpec, tmp_path: Path, **task):
    return render_harness(
        spec,
        rollout=Rollout(rollout_id="r-1", api_key="hrl-secret", task=task),
        workspace=tmp_path / "attempt" / "workspace",
        base_url="http://127.0.0.1:9/rollouts/r-1/v1",
        anthropic_base_url="http://127.0.0.1:9/rollouts/r-1",
        inside=ROLLOUT_PATHS,
    )


def rollout_cli(tmp_path: Path, harness: str, task: dict, *, run_dir: Path, timeout_s: float = 300):
    """``harnessrl rollout`` with the scripted engine (one plain answer) and a command evaluator."""
    (tmp_path / "replies.json").write_text(
        json.dumps({"turns": ["All done."], "on_exhausted": "repeat_last"})
    )
    config = tmp_path / "rollout.toml"
    config.write_text(
        f'[engine]\nmodel = "scripted:{tmp_path / "replies.json"}"\ncontext_length = 262144\n\n'
        f"[harness]\n{harness}\n\n"
        "[harness.limits]\nmemory_mb = 8192\nmax_processes = 1024\n\n"
        '[evaluator]\ntype = "command"\ncommand = ["true"]\n\n'
        "[controller]\nmax_infra_retries = 0\n"
    )
    (tmp_path / "task.json").write_text(json.dumps(task))
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return subprocess.run(
        [*HARNESSRL, "rollout", "--config", str(config), "--task", f"@{tmp_path / 'task.json'}"]
        + ["--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
    )


def summary(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- prompts that start with "-" -------------------------------------------------------------------


@pytest.mark.parametrize("preset", DASHED)
def test_preset_args_go_before_the_end_of_options(preset):
    spec = apply_preset(HarnessSpec(preset=preset, args=["--extra", "x"]))
    assert spec.command[-2:] == ["--", "{prompt}"]
    assert spec.command[-4:-2] == ["--extra", "x"] and spec.args == []


@pytest.mark.parametrize("preset", ["claude-code", "codex"])
def test_search_tools_options_go_before_the_end_of_options(preset):
    spec = apply_preset(HarnessSpec(preset=preset, tools=["search"]))
    assert spec.command[-2:] == ["--", "{prompt}"]
    assert any("mcp" in arg for arg in spec.command[:-2])


def test_a_users_own_command_is_left_as_written():
    spec = apply_preset(HarnessSpec(preset="codex", command=["codex", "exec", "{prompt}"], args=["--x"]))
    assert spec.command == ["codex", "exec", "{prompt}"] and spec.args == ["--x"]


@needs_root
@pytest.mark.parametrize("prompt", ["- fix the parser (PROMPTMARK)", "--help"])
@pytest.mark.parametrize("preset", DASHED)
def test_a_prompt_starting_with_a_dash_reaches_the_harness(preset, prompt, tmp_path):
    # The real harness parses its own command line: "- fix …" was refused as an unknown option (a
    # policy failure with no call made) and "--help" printed the help and exited 0.
    exe = PRESETS[preset]().command[0]
    if shutil.which(exe) is None and not Path(exe).is_file():
        pytest.skip(f"{preset}: {exe!r} is not installed (./install.sh)")
    run = tmp_path / "run"
    done = summary(
        rollout_cli(tmp_path, f'preset = "{preset}"\ntimeout_s = 180', {"prompt": prompt}, run_dir=run)
    )
    store = SQLiteStore(run / "harnessrl.db")
    try:
        calls = store.list_calls(done["rollout_id"])
    finally:
        store.close()
    assert done["outcome"] == "success", done
    assert calls and prompt in json.dumps(calls[0].request)


# -- task data no exec can take -----------------------------------------------------------------


def test_a_nul_byte_in_the_environment_is_refused_naming_the_field(tmp_path):
    spec = HarnessSpec(command=["true"], env={"REPO": "{task[repo]}"})
    with pytest.raises(ConfigError, match=r"harness\.env\.REPO: contains a NUL byte"):
        render(spec, tmp_path, repo="a\0--bind\0/\0/rollout/host")


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (HarnessSpec(command=["echo", "{prompt}"]), r"harness\.command\[1\]"),
        (HarnessSpec(command=["true"], args=["{prompt}"]), r"harness\.args\[0\]"),
        (HarnessSpec(command=["true"], files={"{task[name]}": "x"}), r"harness\.files"),
        (HarnessSpec(command=["true"], workdir="{task[name]}"), r"harness\.workdir"),
    ],
)
@pytest.mark.parametrize("bad", ["a\0b", "a\ud800b"])
def test_text_no_program_or_path_can_hold_is_refused_naming_the_field(spec, field, bad, tmp_path):
    with pytest.raises(ConfigError, match=field):
        render(spec, tmp_path, prompt=bad, name=bad)


def test_file_content_no_file_can_hold_is_refused_naming_the_file(tmp_path):
    """A lone surrogate in a file's content raised ``UnicodeEncodeError`` when the workspace (or the
    pod's Secret) was written: a "controller error", the task field never named."""
    spec = HarnessSpec(command=["true"], files={"notes.txt": "{task[name]}"})
    with pytest.raises(ConfigError, match=r"harness\.files\['notes\.txt'\]: holds a lone surrogate"):
        render(spec, tmp_path, name="a\ud800b")
    rendered = render(spec, tmp_path, name="a\0b é")  # the control: a NUL and UTF-8 are file content
    assert rendered.files == {"notes.txt": "a\0b é"}


def test_a_prompt_longer_than_one_argument_may_be_is_refused_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"harness\.command\[1\]: \d+ bytes.*task_file"):
        render(HarnessSpec(command=["echo", "{prompt}"]), tmp_path, prompt="x" * (MAX_EXEC_STRING + 1))


def test_a_task_too_long_for_one_variable_leaves_it_to_the_task_file(tmp_path):
    task = {"prompt": "hi", "notes": "x" * (MAX_EXEC_STRING + 1)}
    rendered = render(HarnessSpec(command=["true"]), tmp_path, **task)
    assert "HARNESSRL_TASK" not in rendered.env
    assert json.loads(rendered.task_file.read_text()) == task
    small = render(HarnessSpec(command=["true"]), tmp_path, prompt="hi")
    assert json.loads(small.env["HARNESSRL_TASK"]) == {"prompt": "hi"}


def test_a_prompt_that_is_not_a_string_is_given_as_json(tmp_path):
    messages = [{"role": "user", "content": "hi", "cached": True}]
    rendered = render(HarnessSpec(command=["echo", "{prompt}", "{task[prompt]}"]), tmp_path, prompt=messages)
    assert json.loads(rendered.argv[1]) == messages and rendered.argv[1] == rendered.argv[2]


PRINT_ENV = (
    'preset = "python"\ntimeout_s = 60\n'
    'command = ["-c", "import os, sys; print(os.path.isdir(\'/rollout/host/etc\'), len(sys.argv))"]\n'
)


@needs_root
def test_a_nul_byte_in_a_task_field_adds_no_sandbox_option(tmp_path):
    # The environment reaches bubblewrap as NUL-separated options: this value bound the host's whole
    # file system, writable, at /rollout/host, and the rollout succeeded.
    harness = PRINT_ENV + '[harness.env]\nREPO = "{task[repo]}"'
    task = {"prompt": "hi", "repo": "a\0--bind\0/\0/rollout/host"}
    run = tmp_path / "run"
    proc = rollout_cli(tmp_path, harness, task, run_dir=run)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "harness.env.REPO" in proc.stderr and "NUL" in proc.stderr
    assert not run.exists()  # refused before the run folder or the store was made


@needs_root
def test_a_task_too_long_for_the_environment_still_runs(tmp_path):
    # HARNESSRL_TASK held the whole task: past 128 KiB no exec could start, and every attempt failed
    # as "bwrap failed to set up the sandbox".
    task = {"prompt": "hi", "notes": "x" * 200_000}
    run = tmp_path / "run"
    done = summary(rollout_cli(tmp_path, PRINT_ENV, task, run_dir=run))
    assert done["outcome"] == "success", done
    assert (Path(done["log"]) / "stdout.log").read_text().split() == ["False", "1"]
    assert json.loads((Path(done["log"]) / "task.json").read_text()) == task


def test_rollout_refuses_a_task_its_harness_cannot_start_on(tmp_path):
    # The task lacks the field the command names: it was created, failed as an infrastructure
    # failure of every attempt, and the command exited 0 with a run folder and a store.
    harness = 'preset = "python"\ncommand = ["-c", "pass", "{task[question]}"]'
    run = tmp_path / "run"
    proc = rollout_cli(tmp_path, harness, {"prompt": "hi"}, run_dir=run)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "harness.command[" in proc.stderr and "question" in proc.stderr
    assert not run.exists()
    assert list((tmp_path / "tmp").iterdir()) == []  # no scratch folder left behind either


@needs_root
def test_a_workdir_the_workspace_lacks_is_named(tmp_path):
    # bwrap could not chdir there: the attempt failed as "bwrap failed to set up the sandbox"; then
    # every attempt as "not a folder of the workspace". Now refused before the rollout starts.
    run = tmp_path / "run"
    proc = rollout_cli(tmp_path, PRINT_ENV + 'workdir = "sub"', {"prompt": "hi"}, run_dir=run)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "harness.workdir: 'sub' is not a folder of the workspace" in proc.stderr
    assert not run.exists()
    # Control: a workdir that harness.files makes is where the harness starts.
    made = tmp_path / "made"
    made.mkdir()
    harness = PRINT_ENV + 'workdir = "sub"\n[harness.files]\n"sub/keep.txt" = "x"'
    done = summary(rollout_cli(made, harness, {"prompt": "hi"}, run_dir=made / "run"))
    assert done["outcome"] == "success", done


@pytest.mark.parametrize("content", ["{not json", "[]"])
def test_a_users_opencode_config_that_is_no_json_object_is_named(content):
    # harness.tools = ["search"] adds the MCP server to it: a JSONDecodeError / TypeError traceback.
    spec = HarnessSpec(preset="opencode", tools=["search"], env={"OPENCODE_CONFIG_CONTENT": content})
    with pytest.raises(ConfigError, match=r"harness\.env\.OPENCODE_CONFIG_CONTENT: not a JSON object"):
        apply_preset(spec)
