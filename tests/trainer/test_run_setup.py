"""``prepare_run``: a run folder saved by an older harnessrl resumes under today's schema, and the
preflight refuses what would fail every rollout before the run folder is created."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.errors import ConfigError
from harnessrl.trainer.run_setup import CONFIG_FILE, prepare_run

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "tiny" / "train.toml"


def test_an_older_runs_saved_config_resumes(tmp_path):
    config, run_dir, _ = prepare_run(str(CONFIG), None, [f"run.dir={tmp_path / 'run'}"])
    saved = json.loads((run_dir / CONFIG_FILE).read_text())
    # What every run folder written before the two fields went held (all fields are saved):
    del saved["algorithm"]["proximal"]
    saved["algorithm"]["tis_cap"] = 2.0
    saved["trainer"]["rollout_timeout_s"] = None
    (run_dir / CONFIG_FILE).write_text(json.dumps(saved))

    resumed, _, _ = prepare_run(None, str(run_dir), ["trainer.steps=14"])
    assert resumed.algorithm.tis_cap is None and resumed.algorithm.proximal == "behaviour"
    assert resumed.trainer.steps == 14 and resumed.run.name == config.run.name


def test_a_current_config_keeps_its_tis_cap_and_refuses_unknown_fields(tmp_path):
    _, run_dir, _ = prepare_run(
        str(CONFIG),
        None,
        [f"run.dir={tmp_path / 'run'}", 'algorithm.proximal="trainer"', "algorithm.tis_cap=1.5"],
    )
    assert prepare_run(None, str(run_dir), [])[0].algorithm.tis_cap == 1.5
    saved = json.loads((run_dir / CONFIG_FILE).read_text())
    saved["trainer"]["no_such_field"] = 1  # control: only the known removed fields are dropped
    (run_dir / CONFIG_FILE).write_text(json.dumps(saved))
    with pytest.raises(ConfigError, match="no_such_field"):
        prepare_run(None, str(run_dir), [])


def _train(tmp_path, *sets: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "harnessrl", "train", str(CONFIG), "--set", f"run.dir={tmp_path / 'run'}"]
    for item in sets:
        argv += ["--set", item]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_a_missing_harness_script_is_refused_before_anything_is_created(tmp_path):
    # The typo of the issue: every rollout used to fail as the policy's fault and the run "trained".
    proc = _train(tmp_path, f'harness.command=["{tmp_path / "agentt.py"}", "{{prompt}}"]')
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "harness.command[1]" in proc.stderr and "agentt.py" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()
    # Control: the example's real script passes the same preflight (prepare_run runs it).
    _, run_dir, _ = prepare_run(str(CONFIG), None, [f"run.dir={tmp_path / 'real'}"])
    assert run_dir.is_dir()


def test_wandb_asked_for_but_missing_is_refused_before_anything_is_created(tmp_path):
    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    proc = _train(tmp_path, "metrics.wandb_project=demo")
    assert proc.returncode == 2 and "metrics.wandb_project" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "run").exists()


def test_a_non_executable_harness_is_refused(tmp_path):
    from harnessrl.controller.base import HarnessSpec
    from harnessrl.controller.harness import check_harness

    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(ConfigError, match=r"harness.command\[0\].*not executable"):
        check_harness(HarnessSpec(command=[str(script)]))
    script.chmod(0o755)
    check_harness(HarnessSpec(command=[str(script)]))


def test_the_default_run_folder_is_beside_the_config_file_wherever_the_command_runs(tmp_path, monkeypatch):
    config_dir = tmp_path / "project"
    config_dir.mkdir()
    config_file = config_dir / "train.toml"
    # The tiny example's config, its script path made absolute so the copy still finds it.
    text = CONFIG.read_text().replace('"./', f'"{CONFIG.parent}/')
    config_file.write_text(text)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config, run_dir, _ = prepare_run(str(config_file), None, [])
    assert run_dir == config_dir / "runs" / config.run.name and run_dir.is_dir()
    assert not (elsewhere / "runs").exists()
    # An explicit run.dir is taken as given (relative to where the command runs).
    _, explicit, _ = prepare_run(str(config_file), None, ["run.dir=mine"])
    assert explicit.resolve() == (elsewhere / "mine").resolve()


def test_tensorboard_asked_for_by_name_but_missing_is_refused_the_default_is_not(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # find_spec reports it missing
    with pytest.raises(ConfigError, match=r"^metrics\.tensorboard: tensorboard is not installed"):
        prepare_run(str(CONFIG), None, [f"run.dir={tmp_path / 'asked'}", "metrics.tensorboard=true"])
    assert not (tmp_path / "asked").exists()
    # Left at its default (on, optional) it does not stop a run: metrics.jsonl has everything.
    text = CONFIG.read_text().replace('"./', f'"{CONFIG.parent}/')
    copy = tmp_path / "train.toml"
    copy.write_text("\n".join(line for line in text.splitlines() if not line.startswith("tensorboard")))
    config, run_dir, _ = prepare_run(str(copy), None, [f"run.dir={tmp_path / 'default'}"])
    assert config.metrics.tensorboard and run_dir.is_dir()


def _project(tmp_path: Path) -> Path:
    """The tiny example's config copied into ``tmp_path/project`` (script paths made absolute), so
    its default run folder (runs/<run.name>) lands there."""
    project = tmp_path / "project"
    project.mkdir()
    config = project / "train.toml"
    config.write_text(CONFIG.read_text().replace('"./', f'"{CONFIG.parent}/'))
    return config


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_missing_model_or_a_busy_port_is_refused_before_the_run_folder_exists(tmp_path):
    import socket

    config = _project(tmp_path)
    with pytest.raises(ConfigError, match=r"^engine\.model: unknown model './nomodel'"):
        prepare_run(str(config), None, ["engine.model=./nomodel"])
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"^gateway: cannot listen on 127.0.0.1:{port}"):
            prepare_run(str(config), None, [f"gateway.port={port}"])
    assert _listing(tmp_path) == ["project", "project/train.toml"]
    # The next try, fixed, is a new run (not "already exists; pass --resume").
    _, run_dir, _ = prepare_run(str(config), None, ["gateway.port=0"])
    assert run_dir == config.parent / "runs" / "tiny-vowels"
    proc = _train(tmp_path, "engine.model=./nomodel")  # the command: exit 2, the field named
    assert proc.returncode == 2 and "engine.model" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "run").exists()


def test_the_already_exists_guard_sees_through_dot_dot(tmp_path):
    _, existing, _ = prepare_run(str(CONFIG), None, [f"run.dir={tmp_path / 'existing'}"])
    saved = (existing / CONFIG_FILE).read_text()
    with pytest.raises(ConfigError, match="already exists"):
        prepare_run(str(CONFIG), None, [f"run.dir={tmp_path / 'nothere' / '..' / 'existing'}"])
    assert (existing / CONFIG_FILE).read_text() == saved and not (tmp_path / "nothere").exists()


@pytest.mark.parametrize("name", ["", ".", "..", "../..", "a/b"])
def test_run_name_must_be_a_plain_folder_name(tmp_path, name):
    config = _project(tmp_path)
    with pytest.raises(ConfigError, match=r"run\.name: .*plain folder name"):
        prepare_run(str(config), None, [f"run.name={json.dumps(name)}"])
    assert _listing(tmp_path) == ["project", "project/train.toml"]


def test_resume_refuses_a_set_without_equals_and_a_corrupt_config(tmp_path):
    _, run_dir, _ = prepare_run(str(CONFIG), None, [f"run.dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=r"'trainer\.steps' must look like section\.key=value"):
        prepare_run(None, str(run_dir), ["trainer.steps"])
    (run_dir / CONFIG_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match=r"config\.json is not valid JSON"):
        prepare_run(None, str(run_dir), [])


def test_resume_refuses_a_changed_seed(tmp_path):
    # The schedule orders each epoch's tasks by run.seed: a resumed run under another seed would
    # train some tasks of the epoch twice and others never.
    _, run_dir, _ = prepare_run(str(CONFIG), None, [f"run.dir={tmp_path / 'run'}", "run.seed=1"])
    with pytest.raises(ConfigError, match=r"run\.seed: cannot change on --resume"):
        prepare_run(None, str(run_dir), ["run.seed=2"])
    assert prepare_run(None, str(run_dir), ["run.seed=1"])[0].run.seed == 1  # the same seed is fine


def test_one_file_carries_the_kubernetes_section_for_the_runs_external_controllers(tmp_path):
    """docs/scale.md: `harnessrl controller --config SAME_FILE` with a [kubernetes] section launches
    the run's harnesses as Jobs; `harnessrl train` refused that same file ("extra inputs")."""
    kubernetes = [
        "kubernetes.gateway_url='http://10.96.0.10:8000'",
        "kubernetes.network_policy={gateway_port = 8000, gateway_pod_labels = {app = 'gw'}}",
    ]
    config, _, _ = prepare_run(
        str(CONFIG), None, [f"run.dir={tmp_path / 'ok'}", "trainer.controllers='external'", *kubernetes]
    )
    assert config.kubernetes is not None and config.kubernetes.gateway_url == "http://10.96.0.10:8000"
    # A run that launches its own harnesses would silently not use it: refused, naming the section.
    with pytest.raises(ConfigError, match=r'kubernetes: .*trainer.controllers = "external"'):
        prepare_run(str(CONFIG), None, [f"run.dir={tmp_path / 'local'}", *kubernetes])
    assert not (tmp_path / "local").exists()


def test_a_resume_resolves_relative_paths_of_its_overrides_as_a_new_run_does(tmp_path, monkeypatch):
    """``--resume RUN --set 'harness.command=["./agent.py", …]'`` kept "./agent.py" as written: every
    later attempt would have looked for it in its own workspace."""
    _, run_dir, base_dir = prepare_run(str(CONFIG), None, [f"run.dir={tmp_path / 'run'}"])
    monkeypatch.chdir(tmp_path)  # another folder than the config's
    resumed, _, _ = prepare_run(None, str(run_dir), ['harness.command=["./agent.py", "{prompt}"]'])
    assert resumed.harness.command[0] == str((base_dir / "agent.py").resolve())
    saved = json.loads((run_dir / CONFIG_FILE).read_text())
    assert saved["harness"]["command"][0] == str(CONFIG.parent.resolve() / "agent.py")
