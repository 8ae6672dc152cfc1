"""Config problems of ``harnessrl train`` refused when the config is read (exit 2 naming the field,
nothing created), not found later as a traceback or a run that waits forever; and ``--resume``
overrides that would change what the run's checkpoints hold, refused before ``config.json`` is
written back (otherwise every later plain ``--resume`` failed on the saved change)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.errors import ConfigError
from harnessrl.trainer.run_setup import CONFIG_FILE, prepare_run

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "tiny" / "train.toml"


def _train(run_dir: Path, *sets: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "harnessrl", "train", str(CONFIG), "--set", f"run.dir={run_dir}"]
    for item in ("metrics.progress=false", "trainer.steps=1", *sets):
        argv += ["--set", item]
    # The bound only ends a hung test: each refused config exits before any model loads.
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        # A group's rollouts are admitted together: with fewer allowed in flight none ever started.
        ("trainer.max_in_flight=1", "trainer.max_in_flight"),
        # Finite in the config's check, refused by the rollouts' sampling overrides: a traceback.
        ("trainer.temperature=inf", "trainer.temperature"),
        # Below the engines' 0.01 floor: sampled at 0.01, trained as if at 0.001.
        ("trainer.temperature=0.001", "trainer.temperature"),
        ("trainer.eval_temperature=inf", "trainer.eval_temperature"),
        ("trainer.max_tokens=10000000000000", "trainer.max_tokens"),
        # Every rollout of a step planned at once: the process ran out of memory (SIGKILL).
        ("trainer.tasks_per_step=100000000000", "trainer.tasks_per_step"),
    ],
)
def test_a_bad_trainer_field_exits_2_naming_it_and_creates_nothing(tmp_path, setting, field):
    run_dir = tmp_path / "run"
    proc = _train(run_dir, "trainer.mode='async'", "trainer.group_size=2", setting)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert field in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not run_dir.exists()


def test_max_in_flight_of_one_whole_group_is_accepted(tmp_path):
    # Control for the check above: one group's worth is enough to admit a group.
    config, _, _ = prepare_run(
        str(CONFIG),
        None,
        [
            f"run.dir={tmp_path / 'run'}",
            "trainer.mode='async'",
            "trainer.group_size=2",
            "trainer.max_in_flight=2",
        ],
    )
    assert config.trainer.max_in_flight == 2


def _saved(run_dir: Path) -> dict:
    return json.loads((run_dir / CONFIG_FILE).read_text())


@pytest.mark.parametrize(
    ("run_sets", "resume_sets", "message"),
    [
        # A full-model run resumed with LoRA: the base weights plus an adapter the checkpoint does
        # not have (a FileNotFoundError traceback, after config.json kept the section).
        ([], ["trainer.lora.r=4"], r"trainer\.lora: cannot be added on --resume"),
        # The adapter was trained at rank 4: refused only when the checkpoint loaded, after
        # config.json was rewritten with r = 8, so every plain --resume failed the same way.
        (["trainer.lora.r=4"], ["trainer.lora.r=8"], r"trainer\.lora\.r: cannot change on --resume"),
        (["trainer.lora.r=4"], ["trainer.lora.alpha=8"], r"trainer\.lora\.alpha: cannot change on --resume"),
        (
            ["trainer.lora.r=4"],
            ["trainer.lora.target_modules=['q_proj']"],
            r"trainer\.lora\.target_modules: cannot change on --resume",
        ),
        # The weights a run with remote engines trains (the LoRA base, the KL reference).
        ([], ["trainer.model='smollm2'"], r"trainer\.model: cannot change on --resume"),
    ],
)
def test_resume_refuses_a_changed_lora_or_base_model_and_keeps_the_saved_config(
    tmp_path, run_sets, resume_sets, message
):
    _, run_dir, _ = prepare_run(str(CONFIG), None, [f"run.dir={tmp_path / 'run'}", *run_sets])
    before = _saved(run_dir)
    with pytest.raises(ConfigError, match=message):
        prepare_run(None, str(run_dir), ["trainer.steps=20", *resume_sets])
    assert _saved(run_dir) == before


def test_resume_may_change_lora_dropout_and_the_order_of_the_target_modules(tmp_path):
    # Control: what the adapter's files do not fix may change on --resume, and is saved.
    _, run_dir, _ = prepare_run(str(CONFIG), None, [f"run.dir={tmp_path / 'run'}", "trainer.lora.r=4"])
    modules = list(reversed(_saved(run_dir)["trainer"]["lora"]["target_modules"]))
    resumed, _, _ = prepare_run(
        None, str(run_dir), ["trainer.lora.dropout=0.1", f"trainer.lora.target_modules={json.dumps(modules)}"]
    )
    assert resumed.trainer.lora is not None and resumed.trainer.lora.dropout == 0.1
    assert _saved(run_dir)["trainer"]["lora"]["dropout"] == 0.1


def test_a_task_the_harness_cannot_start_on_is_refused_naming_it_before_the_run_folder(tmp_path):
    """A harness command naming a field the tasks lack was found only at launch: each attempt an
    infrastructure failure retried three times, the task never trained (and a whole step of them
    stopped the run after its folder, store and model were made)."""
    run_dir = tmp_path / "run"
    proc = _train(run_dir, "harness.command=['./agent.py', '{task[question]}']")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "tasks: task 'd0': the harness cannot start on it: harness.command[" in proc.stderr, proc.stderr
    assert "the task has no field 'question'" in proc.stderr
    assert "Traceback" not in proc.stderr and not run_dir.exists()
    # The control: the example's own command renders for every task.
    config, _, _ = prepare_run(str(CONFIG), None, [f"run.dir={tmp_path / 'ok'}"])
    assert (tmp_path / "ok" / CONFIG_FILE).is_file()


def test_a_gateway_port_the_sandbox_cannot_relay_is_refused_before_the_run_folder(tmp_path):
    """Port 80: the relay inside each sandbox runs unprivileged and cannot listen there, so every
    attempt of every rollout was an infrastructure failure and the run ended after loading the
    model, its folder made."""
    run_dir = tmp_path / "run"
    proc = _train(run_dir, "gateway.port=80")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "gateway.port" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not run_dir.exists()


@pytest.mark.parametrize("exposed", [True, False])
def test_a_mount_may_not_expose_a_sqlite_url_store(tmp_path, exposed):
    """A ``sqlite://`` URL was not checked against ``harness.mounts`` (only a plain path was), so the
    agent could read the store: every task's ``hidden`` answers. The other folder is the control."""
    store_dir, other = tmp_path / "store", tmp_path / "other"
    store_dir.mkdir()
    other.mkdir()
    sets = [
        f"run.dir={tmp_path / 'run'}",
        f"store.url='sqlite:///{store_dir / 'runs.db'}'",
        f"harness.mounts=['{store_dir if exposed else other}']",
    ]
    if exposed:
        with pytest.raises(ConfigError, match=r"harness\.mounts"):
            prepare_run(str(CONFIG), None, sets)
        assert not (tmp_path / "run").exists()
    else:
        config, _, _ = prepare_run(str(CONFIG), None, sets)
        assert config.harness.mounts == [str(other)]


@pytest.mark.parametrize("exposed", [True, False])
def test_an_evaluator_mount_may_not_expose_the_store_either(tmp_path, exposed):
    """``evaluator.mounts`` were checked against the run folder only: a store outside it (a
    ``sqlite://`` URL) could be mounted into the scorer's sandbox, where the code the policy wrote runs
    while it is scored, and read there (every task's ``hidden`` answers). The other folder is the
    control."""
    store_dir, other = tmp_path / "store", tmp_path / "other"
    store_dir.mkdir()
    other.mkdir()
    mount = store_dir if exposed else other
    sets = [
        f"run.dir={tmp_path / 'run'}",
        f"store.url='sqlite:///{store_dir / 'runs.db'}'",
        f"evaluator={{type = 'command', command = ['true'], mounts = ['{mount}']}}",
    ]
    if exposed:
        with pytest.raises(ConfigError, match=r"evaluator\.mounts"):
            prepare_run(str(CONFIG), None, sets)
        assert not (tmp_path / "run").exists()
    else:
        config, _, _ = prepare_run(str(CONFIG), None, sets)
        assert config.evaluator.mounts == [str(other)]
