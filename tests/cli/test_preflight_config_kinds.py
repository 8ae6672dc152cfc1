"""Config values that name the wrong thing, refused before anything starts, through the commands
(``train``, ``rollout``, ``data calibrate``): each is exit 2, one line naming the field, no run
folder made; each has a control showing what passes.

Run in-process (typer's ``CliRunner``) on the tiny example's config copied into ``tmp_path``; the
rollout configs use a scripted engine (no model loads before the checks)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from tests.cli.cli_support import TINY, invoke, listing, refused

from harnessrl.cli.rollout import load_rollout_config
from harnessrl.controller.harness import check_task
from harnessrl.controller.presets import apply_preset
from harnessrl.controller.stack import prepare
from harnessrl.errors import ConfigError
from harnessrl.trainer.run_setup import prepare_run


@pytest.fixture
def project(tmp_path: Path) -> Path:
    shutil.copy(TINY, tmp_path / "train.toml")
    shutil.copy(TINY.parent / "agent.py", tmp_path / "agent.py")
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "README").write_text("the task's repository\n")
    (tmp_path / "a-file").write_text("not a folder\n")
    return tmp_path


def rollout_config(folder: Path, extra: str = "") -> Path:
    (folder / "replies.json").write_text(json.dumps({"turns": ["done"]}))
    config = folder / "rollout.toml"
    config.write_text(
        f'[engine]\nmodel = "scripted:{folder / "replies.json"}"\n\n'
        f'[harness]\npreset = "python"\ncommand = ["-c", "pass"]\n{extra}\n'
        '[evaluator]\ntype = "exact_match"\n'
    )
    return config


@pytest.mark.parametrize(("repo", "what"), [("./missing", "does not exist"), ("./a-file", "is not a folder")])
def test_train_refuses_a_repo_that_is_no_folder_before_the_run_folder_exists(project, repo, what):
    before = listing(project)
    with pytest.raises(ConfigError, match=rf"^tasks: task 'd0': .*harness\.repo: .* {what}"):
        prepare_run(str(project / "train.toml"), None, [f'harness.repo="{repo}"'])
    result = invoke("train", str(project / "train.toml"), "--set", f'harness.repo="{repo}"')
    refused(result, "harness.repo", what)
    assert listing(project) == before  # no run folder, no store
    # The control: a folder that is there starts the run.
    _, run_dir, _ = prepare_run(str(project / "train.toml"), None, ['harness.repo="./repo"'])
    assert run_dir.is_dir()


def test_train_with_external_controllers_does_not_look_for_the_repo_here(project):
    # Their machines copy harness.repo, not this one: a path only they have is not refused.
    _, run_dir, _ = prepare_run(
        str(project / "train.toml"),
        None,
        ['harness.repo="/only/on/the/controllers"', 'trainer.controllers="external"'],
    )
    assert run_dir.is_dir()


def test_rollout_refuses_a_repo_template_naming_no_folder_for_the_task(tmp_path):
    (tmp_path / "repo").mkdir()
    config = rollout_config(tmp_path, 'repo = "{task[hidden.repo_path]}"\n')
    run_dir = tmp_path / "run"
    task = {"prompt": "hi", "hidden": {"answer": "x", "repo_path": str(tmp_path / "nope")}}
    result = invoke("rollout", "--config", str(config), "--task", json.dumps(task), "--run-dir", str(run_dir))
    refused(result, "harness.repo", "nope", "does not exist")
    assert not run_dir.exists()


def test_data_calibrate_refuses_a_repo_that_is_no_folder(tmp_path):
    config = rollout_config(tmp_path, f'repo = "{tmp_path / "missing"}"\n')
    records = tmp_path / "in.jsonl"
    base = {"repo": "o/p", "base_commit": "0" * 40, "problem_statement": "What is 6*7?", "answer": "42"}
    records.write_text(json.dumps({**base, "instance_id": "o__p.1"}) + "\n")
    run_dir, out = tmp_path / "run", tmp_path / "out.jsonl"
    args = ["data", "calibrate", str(records), str(out), "--config", str(config), "--k", "1"]
    refused(invoke(*args, "--run-dir", str(run_dir)), "'o__p.1'", "harness.repo", "does not exist")
    assert not run_dir.exists() and not out.exists()


@pytest.mark.parametrize("rel", ["../escape", "/abs/file", "a/../../escape", "."])
def test_train_refuses_a_harness_file_outside_the_workspace_before_the_run_folder_exists(project, rel):
    before = listing(project)
    setting = f'harness.files={{{json.dumps(rel)}="x"}}'
    with pytest.raises(ConfigError, match=r"^tasks: task 'd0': .*harness\.files: .* inside the workspace"):
        prepare_run(str(project / "train.toml"), None, [setting])
    refused(invoke("train", str(project / "train.toml"), "--set", setting), "harness.files", repr(rel))
    assert listing(project) == before
    # The control: a path that stays inside (through a "..") starts the run.
    _, run_dir, _ = prepare_run(str(project / "train.toml"), None, ['harness.files={"a/../notes.txt"="x"}'])
    assert run_dir.is_dir()


def test_rollout_refuses_a_harness_file_a_task_field_puts_outside_the_workspace(tmp_path):
    config = rollout_config(tmp_path, 'files = { "{task[name]}" = "x" }\n')
    run_dir = tmp_path / "run"
    task = {"prompt": "hi", "name": "../../escape", "hidden": {"answer": "x"}}
    result = invoke("rollout", "--config", str(config), "--task", json.dumps(task), "--run-dir", str(run_dir))
    refused(result, "harness.files", "'../../escape'")
    assert not run_dir.exists() and not (tmp_path / "escape").exists()


def test_rollout_refuses_a_store_file_that_is_no_database_and_leaves_no_run_folder(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("someone's notes, named by mistake\n")
    config = rollout_config(tmp_path, f'\n[store]\nurl = "{notes}"\n')
    run_dir = tmp_path / "runs" / "one"
    args = ["rollout", "--config", str(config), "--run-dir", str(run_dir)]
    task = json.dumps({"prompt": "hi", "hidden": {"answer": "done"}})
    refused(invoke(*args, "--task", task), "store.url", "not a SQLite database")
    assert not (tmp_path / "runs").exists()
    assert notes.read_text() == "someone's notes, named by mistake\n"
    # A file with SQLite's header that SQLite still cannot open: refused when opened, the run folder
    # (and the parent made for it) removed again.
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(b"SQLite format 3\x00" + b"garbage" * 20)
    result = invoke(*args, "--task", task, "--set", f'store={{url="{damaged}"}}')
    refused(result, "damaged.db")
    assert not (tmp_path / "runs").exists()


def test_train_refuses_a_store_file_that_is_no_database_before_the_run_folder_exists(project):
    (project / "notes.txt").write_text("not a database\n")
    before = listing(project)
    result = invoke("train", str(project / "train.toml"), "--set", f'store={{url="{project / "notes.txt"}"}}')
    refused(result, "store.url", "not a SQLite database")
    assert listing(project) == before


def test_a_relative_store_url_names_the_same_store_on_a_resume_from_another_folder(
    project, tmp_path, monkeypatch
):
    # docs/store.md: a relative SQLite path is relative to the working folder the run started in.
    started_in, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    started_in.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(started_in)
    config, run_dir, _ = prepare_run(str(project / "train.toml"), None, ['store={url="stores/run.db"}'])
    assert Path(config.store.url) == started_in / "stores" / "run.db"
    monkeypatch.chdir(elsewhere)
    resumed, _, _ = prepare_run(None, str(run_dir), [])
    assert Path(resumed.store.url) == started_in / "stores" / "run.db"


@pytest.fixture
def tool_outside_the_sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A program on this process's PATH in a folder the sandbox does not show (a /tmp folder)."""
    folder = tmp_path / "tools"
    folder.mkdir()
    (folder / "mytool").write_text("#!/bin/sh\necho hi\n")
    (folder / "mytool").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return folder


def test_rollout_refuses_a_command_on_path_here_that_the_sandbox_cannot_see(
    tmp_path, tool_outside_the_sandbox
):
    (tmp_path / "replies.json").write_text(json.dumps({"turns": ["done"]}))
    config = tmp_path / "rollout.toml"
    config.write_text(
        f'[engine]\nmodel = "scripted:{tmp_path / "replies.json"}"\n\n'
        '[harness]\ncommand = ["mytool"]\n\n[evaluator]\ntype = "exact_match"\n'
    )
    run_dir = tmp_path / "run"
    task = json.dumps({"prompt": "hi", "hidden": {"answer": "done"}})
    result = invoke("rollout", "--config", str(config), "--task", task, "--run-dir", str(run_dir))
    refused(result, "harness.command[0]", "'mytool'", "harness.mounts")
    assert not run_dir.exists()
    # The control: its folder mounted, the sandbox finds it on PATH.
    mounted = load_rollout_config(str(config), [f'harness.mounts=["{tool_outside_the_sandbox}"]'])
    prepare(mounted)
    # Without the sandbox the harness sees this machine's PATH as it is.
    prepare(load_rollout_config(str(config), ['harness.sandbox="none"']))


def test_train_refuses_a_command_on_path_here_that_the_sandbox_cannot_see(project, tool_outside_the_sandbox):
    before = listing(project)
    command = 'harness={command=["mytool", "{prompt}"]}'
    with pytest.raises(ConfigError, match=r"^harness\.command\[0\]: 'mytool' is found at .*tools/mytool"):
        prepare_run(str(project / "train.toml"), None, [command])
    assert listing(project) == before


def test_rollout_refuses_a_scorer_script_that_does_not_exist_instead_of_scoring_every_rollout_0(tmp_path):
    (tmp_path / "check.py").write_text("import sys\nsys.exit(0)\n")
    config = rollout_config(tmp_path)
    run_dir = tmp_path / "run"
    task = json.dumps({"prompt": "hi", "hidden": {"answer": "done"}})
    args = ["rollout", "--config", str(config), "--task", task, "--run-dir", str(run_dir), "--set"]
    missing = tmp_path / "chek.py"  # a typo
    result = invoke(*args, f'evaluator={{type="command", command=["python3", "{missing}"]}}')
    refused(result, "evaluator.command[1]", "chek.py", "does not exist")
    assert not run_dir.exists()
    # The control: the script that is there scores the rollout (exit 0: reward 1).
    result = invoke(*args, f'evaluator={{type="command", command=["python3", "{tmp_path / "check.py"}"]}}')
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["reward"] == 1.0


def test_a_scorer_program_on_path_here_but_not_on_the_scorers_path_is_refused(
    tmp_path, tool_outside_the_sandbox
):
    config = rollout_config(tmp_path)
    run_dir = tmp_path / "run"
    task = json.dumps({"prompt": "hi", "hidden": {"answer": "done"}})
    args = ["rollout", "--config", str(config), "--task", task, "--run-dir", str(run_dir), "--set"]
    result = invoke(*args, 'evaluator={type="command", command=["mytool"]}')
    refused(result, "evaluator.command[0]", "'mytool'", "scorer's PATH")
    assert not run_dir.exists()
    # The control: by its absolute path the scorer runs it (it prints no reward: exit 0 is 1).
    absolute = tool_outside_the_sandbox / "mytool"
    prepare(load_rollout_config(str(config), [f'evaluator={{type="command", command=["{absolute}"]}}']))


def test_rollout_refuses_a_workdir_that_nothing_makes_in_the_workspace(tmp_path):
    config = rollout_config(tmp_path)
    run_dir = tmp_path / "run"
    task = json.dumps({"prompt": "hi", "hidden": {"answer": "done"}})
    args = ["rollout", "--config", str(config), "--task", task, "--run-dir", str(run_dir), "--set"]
    refused(invoke(*args, 'harness.workdir="src/pkg"'), "harness.workdir", "'src/pkg'")
    assert not run_dir.exists()
    # The controls: harness.files or the repo make it.
    workdir_config = load_rollout_config(str(config), ['harness.workdir="src/pkg"'])
    with_file = workdir_config.harness.model_copy(update={"files": {"src/pkg/notes.txt": "x"}})
    check_task(apply_preset(with_file), {"prompt": "hi"})
    (tmp_path / "repo" / "src" / "pkg").mkdir(parents=True)
    with_repo = workdir_config.harness.model_copy(update={"repo": str(tmp_path / "repo")})
    check_task(apply_preset(with_repo), {"prompt": "hi"})


def test_train_refuses_a_workdir_that_nothing_makes_before_the_run_folder_exists(project):
    before = listing(project)
    with pytest.raises(ConfigError, match=r"^tasks: task 'd0': .*harness\.workdir: 'sub'"):
        prepare_run(str(project / "train.toml"), None, ['harness.workdir="sub"'])
    assert listing(project) == before
    # The control: the repo has it.
    (project / "repo" / "sub").mkdir()
    _, run_dir, _ = prepare_run(
        str(project / "train.toml"), None, ['harness.workdir="sub"', 'harness.repo="./repo"']
    )
    assert run_dir.is_dir()


def test_a_mount_that_does_not_exist_is_refused_not_skipped(tmp_path):
    (tmp_path / "data").mkdir()
    config = rollout_config(tmp_path)
    run_dir = tmp_path / "run"
    task = json.dumps({"prompt": "hi", "hidden": {"answer": "done"}})
    args = ["rollout", "--config", str(config), "--task", task, "--run-dir", str(run_dir), "--set"]
    typo = tmp_path / "dta"
    refused(
        invoke(*args, f'harness.mounts=["{tmp_path / "data"}", "{typo}"]'),
        "harness.mounts[1]",
        repr(str(typo)),
    )
    scorer = f'evaluator={{type="command", command=["true"], mounts=["{typo}"]}}'
    refused(invoke(*args, scorer), "evaluator.mounts[0]", "does not exist")
    assert not run_dir.exists()
    # The control: the folder that is there.
    prepare(load_rollout_config(str(config), [f'harness.mounts=["{tmp_path / "data"}"]']))


@pytest.mark.parametrize(
    ("corpus", "what"), [("./missing.jsonl", "does not exist"), ("./repo", "is not a file")]
)
def test_train_refuses_a_corpus_that_is_no_file_before_the_model_loads(project, corpus, what):
    before = listing(project)
    setting = f'retrieval={{corpus="{corpus}"}}'
    with pytest.raises(ConfigError, match=rf"^retrieval\.corpus: .* {what}"):
        prepare_run(str(project / "train.toml"), None, [setting])
    refused(invoke("train", str(project / "train.toml"), "--set", setting), "retrieval.corpus", what)
    assert listing(project) == before
    # The control: a corpus file.
    (project / "corpus.jsonl").write_text(json.dumps({"id": "1", "title": "t", "text": "x"}) + "\n")
    _, run_dir, _ = prepare_run(str(project / "train.toml"), None, ['retrieval={corpus="./corpus.jsonl"}'])
    assert run_dir.is_dir()
