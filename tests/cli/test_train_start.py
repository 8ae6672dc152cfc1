"""``harnessrl train`` before its first step: a bad config is one line naming the field, exit 2, and
no run folder (so the fixed command is a new run, not "already exists; pass --resume"); a start-up
that fails anyway removes the folder it created; ``--resume`` keeps its overrides and refuses
changes to what defines the run; and one run folder is trained by one process at a time.

Run in-process (typer's ``CliRunner``) on the tiny example's config copied into ``tmp_path``."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

import pytest
from tests.cli.cli_support import TINY, invoke, listing, refused
from typer.testing import Result

from harnessrl.trainer.checkpoint import STATE_FILE, TrainState
from harnessrl.trainer.run_setup import CONFIG_FILE, prepare_run

LOCK_FILE = ".lock"  # RUN_DIR/.lock: what a process training the folder holds (docs/train.md)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The tiny example (its config and agent.py) in ``tmp_path``, as the bug reports ran it."""
    shutil.copy(TINY, tmp_path / "train.toml")
    shutil.copy(TINY.parent / "agent.py", tmp_path / "agent.py")
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"task_id": "t0", "prompt": "Say a."}) + "\n")
    return tmp_path


def train(project: Path, *sets: str) -> Result:
    args = ["train", str(project / "train.toml"), "--set", "trainer.steps=1"]
    for item in sets:
        args += ["--set", item]
    return invoke(*args)


BAD_CONFIGS = {
    # (--set, the field the one-line error names)
    "missing tasks file": ('tasks={type="jsonl", path="missing.jsonl"}', "tasks:"),
    "missing heldout file": ('heldout={type="jsonl", path="missing.jsonl"}', "heldout:"),
    "template field no task has": ('tasks.prompt_template="{nofield}"', "tasks.prompt_template"),
    "heldout template": (
        'heldout={type="jsonl", path="tasks.jsonl", prompt_template="{nofield}"}',
        "heldout.prompt_template",
    ),
    "unknown reasoning_gym dataset": ('tasks={type="reasoning_gym", dataset="nosuch"}', "tasks:"),
    "LoRA rank too big": ("trainer.lora.r=100000", "trainer.lora.r"),
    "unsupported store scheme": ('store.url="bogus://x"', "store.url"),
    "refused postgres": ('store.url="postgresql://127.0.0.1:9/x"', "store.url"),
    "store under a file": ('store.url="{project}/agent.py/x.db"', "store.url"),
    "unknown dtype": ("engine.dtype=banana", "engine.dtype"),
    "unknown tool-call parser": ("gateway.tool_call_parser=banana", "gateway.tool_call_parser"),
    "unknown reasoning parser": ("gateway.reasoning_parser=banana", "gateway.reasoning_parser"),
    "unknown engine device": ("engine.device=banana", "engine.device"),
    "unknown trainer device": ("trainer.device=banana", "trainer.device"),
    "run seed too big": ("run.seed=99999999999999999999999", "run.seed"),
    "engine seed too big": ("engine.seed=99999999999999999999999", "engine.seed"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_a_bad_config_creates_nothing_and_the_fixed_command_is_a_new_run(project, case):
    item, field = BAD_CONFIGS[case]
    item = item.replace("{project}", str(project))
    before = listing(project)
    refused(train(project, item), field)
    assert listing(project) == before  # no runs/tiny-vowels, no config.json, no harnessrl.db
    if case == "missing heldout file":  # the held-out source is named as itself, not as [tasks]
        assert "tasks:" not in train(project, item).output


def test_a_cuda_trainer_device_without_cuda_is_refused_naming_it(project):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    before = listing(project)
    refused(train(project, 'trainer.device="cuda:0"'), "trainer.device", "CUDA")
    assert listing(project) == before


def test_a_negative_seed_still_works(project):
    """-1 was accepted before the seeds were bounded (torch takes it): it still is."""
    config, run_dir, _ = prepare_run(str(project / "train.toml"), None, ["run.seed=-1", "engine.seed=-1"])
    assert config.run.seed == -1 and config.engine.seed == -1 and run_dir.is_dir()


def test_a_start_up_that_fails_after_the_folder_exists_removes_it(project):
    """The safety net: weights that pass the preflight (a model folder with a config.json) but
    cannot be loaded fail after the run folder was created; the folder goes, the next command is a
    new run. A folder given empty is left empty, not removed."""
    from harnessrl.engines.models import tiny_model_dir

    broken = project / "broken-model"
    shutil.copytree(tiny_model_dir(), broken)
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    before = listing(project)
    result = train(project, f'engine.model="{broken}"')
    assert result.exit_code != 0, result.output
    assert listing(project) == before  # neither runs/tiny-vowels nor runs/
    empty = project / "given"
    empty.mkdir()
    result = invoke(
        "train", str(project / "train.toml"), "--run-dir", str(empty), "--set", f'engine.model="{broken}"'
    )
    assert result.exit_code != 0, result.output
    assert empty.is_dir() and listing(empty) == []


def finished_run(project: Path) -> Path:
    """A run folder whose checkpoint says step 1 is done: ``--resume`` with ``trainer.steps=1``
    reads and writes its config, then stops ("already finished") without loading a model."""
    _, run_dir, _ = prepare_run(str(project / "train.toml"), None, ["trainer.steps=1"])
    latest = run_dir / "checkpoints" / "latest"
    latest.mkdir(parents=True)
    (latest / STATE_FILE).write_text(TrainState(step=1).to_json())
    return run_dir


def saved(run_dir: Path) -> dict:
    return json.loads((run_dir / CONFIG_FILE).read_text())


def test_resume_writes_its_overrides_back_so_the_next_plain_resume_keeps_them(project):
    run_dir = finished_run(project)
    result = invoke("train", "--resume", str(run_dir), "--set", "trainer.temperature=0.5")
    assert result.exit_code == 0 and "already finished" in result.output, result.output
    assert saved(run_dir)["trainer"]["temperature"] == 0.5
    assert saved(run_dir)["_base_dir"] == str(project)  # still resolves the config's relative paths
    # The plain --resume (what Ctrl-C prints) reads the merged config: no silent revert.
    assert prepare_run(None, str(run_dir), [])[0].trainer.temperature == 0.5


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ('run.name="other"', "run.name"),
        ("trainer.group_size=4", "trainer.group_size"),
        ('engine.model="smollm2"', "engine.model"),
        ('tasks.items=[{task_id="x", prompt="y"}]', "tasks.items"),
        ('heldout={type="inline", items=[{prompt="y"}]}', "heldout"),
        ('store.url="elsewhere.db"', "store"),
        ("run.seed=5", "run.seed"),  # each epoch's task order comes from it
    ],
)
def test_resume_refuses_changes_to_what_defines_the_run(project, item, field):
    run_dir = finished_run(project)
    before = saved(run_dir)
    refused(invoke("train", "--resume", str(run_dir), "--set", item), field, "--resume")
    assert saved(run_dir) == before


def test_a_run_folder_in_use_by_another_process_is_refused(project):
    run_dir = finished_run(project)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a training process holds it
        before = saved(run_dir)
        refused(invoke("train", "--resume", str(run_dir), "--set", "trainer.temperature=0.5"), "in use")
        assert saved(run_dir) == before
    finally:
        os.close(fd)
    # Released: the same command goes ahead (and the lock was let go when it ended).
    assert invoke("train", "--resume", str(run_dir)).exit_code == 0
    assert invoke("train", "--resume", str(run_dir)).exit_code == 0


class _WouldTrain(Exception):
    """Raised in place of loading the model: the command went on to train."""


def test_a_run_whose_final_evaluation_was_cut_short_is_not_already_finished(project, monkeypatch):
    """Regression: ``--resume`` of a run stopped during its final held-out evaluation said "already
    finished" (its checkpoint is at the last step), and that evaluation was lost for good. Finished
    means the step's metrics row, written after the evaluation, is there too."""
    import harnessrl.trainer.run

    def would_train(*args, **kwargs):
        raise _WouldTrain

    monkeypatch.setattr(harnessrl.trainer.run, "Trainer", would_train)
    heldout = ['heldout={type="inline", items=[{task_id="h0", prompt="Say b."}]}', "trainer.eval_every=1"]
    _, run_dir, _ = prepare_run(str(project / "train.toml"), None, ["trainer.steps=1", *heldout])
    latest = run_dir / "checkpoints" / "latest"
    latest.mkdir(parents=True)
    (latest / STATE_FILE).write_text(TrainState(step=1, evaluated_steps=[0]).to_json())
    result = invoke("train", "--resume", str(run_dir))
    assert isinstance(result.exception, _WouldTrain), result.output  # the evaluation runs
    # Control: once the step's row is written (after its evaluation), the run is finished.
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "heldout/reward": 0.5}) + "\n")
    result = invoke("train", "--resume", str(run_dir))
    assert result.exit_code == 0 and "already finished" in result.output, result.output
