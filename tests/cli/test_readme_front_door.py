"""The README's front door stays true: its three commands are the ones CI and users run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def front_door() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "README has no bash block at the top"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_ci_runs_exactly_the_readme_install_and_test_commands():
    install, _, tests = front_door()
    ci = (ROOT / ".ci" / "run").read_text()
    assert install == "./install.sh" and install in ci
    assert tests == ".venv/bin/pytest" and ci.rstrip().splitlines()[-1] == tests


def test_the_main_job_config_is_valid_and_its_heldout_set_is_there(tmp_path):
    from harnessrl.trainer.run_setup import prepare_run

    _, main_job, _ = front_door()
    assert main_job.startswith(".venv/bin/harnessrl train ")
    config_path = ROOT / main_job.split()[-1]
    config, run_dir, base = prepare_run(str(config_path), None, [f"run.dir={tmp_path / 'run'}"])
    assert config.engine.model == "smollm2" and config.harness.command
    assert config.heldout is not None and (base / config.heldout.path).is_file()
    assert run_dir == tmp_path / "run"
