"""``prepare_run``: a run folder saved by an older harnessrl resumes under today's schema."""

from __future__ import annotations

import json
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
