"""Paths in a config file (``config.resolve_relative_paths``): a leading ``~`` of a field that names a
path on this machine is the home folder, expanded in that one place for every field; a path with a
NUL byte is a ``ConfigError`` naming the field, never a ``ValueError`` traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tests.cli.test_bad_input import TINY, invoke, refused

from harnessrl.config import HOME_PATH_FIELDS, resolve_relative_paths
from harnessrl.errors import ConfigError
from harnessrl.trainer.run_setup import open_run


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home folder of the test's own: ``~`` is ``$HOME``."""
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("HOME", str(folder))
    return folder


def test_every_home_path_field_expands_a_leading_tilde(home, tmp_path):
    raw: dict = {}
    for section, key in HOME_PATH_FIELDS:
        value = ["~/a", "/abs"] if key == "mounts" else f"~/{section}-{key}"
        raw.setdefault(section, {})[key] = value
    raw["harness"]["command"] = ["~/agent", "{prompt}"]  # run in the sandbox, whose home is its own
    resolved = resolve_relative_paths(json.loads(json.dumps(raw)), tmp_path / "config-folder")
    for section, key in HOME_PATH_FIELDS:
        expected = [str(home / "a"), "/abs"] if key == "mounts" else str(home / f"{section}-{key}")
        assert resolved[section][key] == expected, f"{section}.{key}"
    assert resolved["harness"]["command"] == ["~/agent", "{prompt}"]
    scripted = resolve_relative_paths({"engine": {"model": "scripted:~/replies.json"}}, tmp_path)
    assert scripted["engine"]["model"] == f"scripted:{home / 'replies.json'}"


def test_a_run_reads_its_tasks_and_store_from_the_home_folder(home, tmp_path):
    """Regression: ``tasks.path = "~/tasks.jsonl"`` was looked for in a folder named ``~`` beside
    the config file, and ``store.url = "~/stores/run.db"`` put the store in a ``~`` folder of the
    working directory."""
    (home / "tasks.jsonl").write_text(json.dumps({"task_id": "t1", "prompt": "say a"}) + "\n")
    (home / "stores").mkdir()
    overrides = [f"run.dir={tmp_path / 'run'}", "tasks.type=jsonl", "tasks.path=~/tasks.jsonl"]
    overrides.append("store.url=~/stores/run.db")
    run = open_run(str(_jsonl_config(tmp_path)), None, overrides)
    try:
        assert [t.task_id for t in run.tasks] == ["t1"]
        assert run.config.store is not None and run.config.store.url == str(home / "stores" / "run.db")
    finally:
        run.folder.release()


def _jsonl_config(tmp_path: Path) -> Path:
    """The tiny example's config without its inline tasks (``[tasks]`` comes from the overrides)."""
    text = TINY.read_text()
    start = text.index("[tasks]")
    end = text.index("[controller]")
    config = tmp_path / "train.toml"
    config.write_text(text[:start] + text[end:])
    (tmp_path / "agent.py").write_text((TINY.parent / "agent.py").read_text())
    return config


@pytest.mark.parametrize(
    "section, key, value, named",
    [
        ("harness", "command", ["./agent\0.py"], "harness.command[0]"),
        ("harness", "repo", "./repo\0", "harness.repo"),
        ("retrieval", "corpus", "corpus\0.jsonl", "retrieval.corpus"),
        ("run", "dir", "runs/a\0b", "run.dir"),
        ("tasks", "path", "t\0.jsonl", "tasks.path"),
        ("engine", "model", "scripted:./r\0.json", "engine.model"),
    ],
)
def test_a_nul_byte_in_a_path_is_a_config_error_naming_the_field(tmp_path, section, key, value, named):
    with pytest.raises(ConfigError, match=rf"^{re.escape(named)}: .*NUL byte"):
        resolve_relative_paths({section: {key: value}}, tmp_path)


def test_environment_paths_with_a_nul_byte_are_named(tmp_path):
    raw = {"harness": {"environment": {"images": {"py": {"containerfile": "C\0"}}}}}
    with pytest.raises(ConfigError, match=r"harness\.environment\.images\.py\.containerfile: .*NUL"):
        resolve_relative_paths(raw, tmp_path)


def test_train_refuses_a_nul_byte_in_a_path_with_exit_2(tmp_path):
    """Regression: ``harnessrl train`` ended in a ``ValueError: embedded null byte`` traceback."""
    for override in ['harness.command=["./agent\\u0000.py"]', 'run.dir="r\\u0000"']:
        result = invoke("train", str(TINY), "--set", f"run.dir={tmp_path / 'run'}", "--set", override)
        refused(result, override.split("=")[0])
        assert "NUL byte" in result.output
        assert not (tmp_path / "run").exists()
