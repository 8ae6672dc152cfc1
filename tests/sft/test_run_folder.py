"""``harnessrl sft``'s run folder, as ``harnessrl train``'s: what the config asks for is checked
before the folder exists (the metrics integrations, the seed, the device), a start-up that fails
after it was created removes it, ``--resume`` keeps its overrides and refuses a changed student or
name, and one process at a time trains a folder (``RUN_DIR/.lock``)."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from harnessrl.cli.main import app

LOCK_FILE = ".lock"  # RUN_DIR/.lock: what a process training the folder holds (docs/sft.md)


def sft(*args: str) -> Result:
    return CliRunner().invoke(app, ["sft", *args])


def config_file(tmp_path: Path, teacher: Path) -> Path:
    path = tmp_path / "sft.toml"
    path.write_text(
        f'[run]\nname = "student"\n[source]\nrun_dir = "{teacher}"\n'
        '[sft]\nmodel = "tiny"\nepochs = 1\nsequences_per_step = 2\n'
        "[metrics]\ntensorboard = false\nprogress = false\n"
    )
    return path


def refused(result: Result, *named: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit), result.output
    for name in named:
        assert name in result.output, result.output


@pytest.fixture
def teacher(record, solving) -> Path:
    return record([solving, solving], [1.0, 1.0]).run_dir


def test_wandb_asked_for_but_missing_is_refused_before_the_model_loads(tmp_path, teacher):
    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    config = config_file(tmp_path, teacher)
    refused(sft(str(config), "--set", "metrics.wandb_project=demo"), "metrics.wandb_project")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("item", "field"),
    [("run.seed=99999999999999999999999", "run.seed"), ("sft.device=banana", "sft.device")],
)
def test_a_bad_seed_or_device_is_refused_before_the_folder_exists(tmp_path, teacher, item, field):
    refused(sft(str(config_file(tmp_path, teacher)), "--set", item), field)
    assert not (tmp_path / "runs").exists()


def test_a_start_up_that_fails_after_the_folder_exists_removes_it(tmp_path, teacher):
    """A student whose folder passes every check but whose weights cannot be loaded: the run folder
    it had created goes, so the fixed command is a new run, not "already exists"."""
    from harnessrl.engines.tiny import tiny_model_dir

    broken = tmp_path / "broken-student"
    shutil.copytree(tiny_model_dir(), broken)
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    result = sft(str(config_file(tmp_path, teacher)), "--set", f'sft.model="{broken}"')
    assert result.exit_code != 0, result.output
    assert not (tmp_path / "runs").exists()


@pytest.fixture
def finished(tmp_path, teacher) -> Path:
    """A finished SFT run (one step)."""
    result = sft(str(config_file(tmp_path, teacher)))
    assert result.exit_code == 0, result.output
    return tmp_path / "runs" / "student"


def saved(run_dir: Path) -> dict:
    return json.loads((run_dir / "config.json").read_text())


def test_resume_writes_its_overrides_back_and_refuses_a_new_student(finished):
    result = sft("--resume", str(finished), "--set", "metrics.progress=true")
    assert result.exit_code == 0 and json.loads(result.stdout.splitlines()[-1])["already_finished"]
    assert saved(finished)["metrics"]["progress"] is True  # the next plain --resume keeps it
    before = saved(finished)
    refused(sft("--resume", str(finished), "--set", 'sft.model="smollm2"'), "sft.model", "--resume")
    refused(sft("--resume", str(finished), "--set", 'run.name="other"'), "run.name")
    assert saved(finished) == before


def test_a_run_folder_in_use_by_another_process_is_refused(finished):
    fd = os.open(finished / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a training process holds it
        refused(sft("--resume", str(finished)), "in use")
    finally:
        os.close(fd)
    assert sft("--resume", str(finished)).exit_code == 0  # released: it goes ahead
