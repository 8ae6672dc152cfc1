"""The pre-flight refuses a ``[harness.environment]`` whose ``field`` no task has: with the host as the
default every task ran on the host, not in the images the section configures, with no message (a
SWE-smith set names its image in ``image_name``, the default field is ``environment``) and the
rewards came out wrong. A set mixing tasks with and without the field, a set whose tasks name
``"host"`` and a section with a ``default`` image still pass."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from tests.environments.image_support import environment_toml, needs_images, tiny_store, tiny_tar

from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.stack import check_environments
from harnessrl.environments.config import EnvironmentConfig
from harnessrl.environments.resolve import Environments, HarnessNeeds
from harnessrl.environments.store import ImageStore
from harnessrl.errors import ConfigError

__all__ = ["tiny_store"]  # the fixture, imported to be used here

SECTION = {"images": {"swe/inflection": {"image": "localhost/harnessrl/swe-inflection:none"}}}
SWE_SMITH = [  # SWE-smith records: the image is in image_name, not in the default field "environment"
    {"instance_id": "a__b.1", "problem_statement": "fix it", "image_name": "swe/inflection"},
    {"instance_id": "a__b.2", "problem_statement": "fix it", "image_name": "swe/inflection"},
]
NEEDS = HarnessNeeds(("/bin/sh",))


def test_a_field_no_task_has_is_refused_naming_it_and_what_to_set():
    harness = HarnessSpec(command=["true"], environment=SECTION)
    with pytest.raises(ConfigError) as refused:
        check_environments(harness, SWE_SMITH)
    message = str(refused.value)
    assert "harness.environment.field is 'environment'" in message
    assert "none of the 2 task(s)" in message and "image_name" in message
    assert "[harness.environment]" in message  # or remove the section
    # An empty value is no environment either.
    with pytest.raises(ConfigError, match="harness.environment.field is 'image_name'"):
        check_environments(
            HarnessSpec(command=["true"], environment={**SECTION, "field": "image_name"}),
            [{**task, "image_name": ""} for task in SWE_SMITH],
        )


def test_rollout_of_a_task_without_the_field_exits_2_before_anything_is_created(tmp_path: Path):
    (tmp_path / "script.json").write_text(json.dumps({"turns": ["unused"]}))
    config = tmp_path / "rollout.toml"
    config.write_text(
        f'[engine]\nmodel = "scripted:{tmp_path / "script.json"}"\n\n'
        '[harness]\npreset = "python"\ncommand = ["-c", "pass"]\n\n'
        '[evaluator]\ntype = "command"\nreward_from = "exit_code"\ncommand = ["true"]\n\n'
        + environment_toml({"field": "repo", "images": SECTION["images"]})
    )
    (tmp_path / "task.json").write_text(json.dumps({**SWE_SMITH[0], "prompt": "x"}))
    done = subprocess.run(
        [sys.executable, "-m", "harnessrl", "rollout", "--config", str(config)]
        + ["--task", f"@{tmp_path / 'task.json'}", "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "harness.environment.field is 'repo'" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()


def test_tasks_naming_the_host_and_an_empty_set_pass_without_podman():
    environments = Environments(EnvironmentConfig.model_validate({**SECTION, "field": "image_name"}))
    host_tasks = [{**task, "image_name": "host"} for task in SWE_SMITH]
    assert environments.check_tasks(host_tasks, NEEDS) == {"host": 2}
    assert environments.check_tasks([], NEEDS) == {}
    assert check_environments(HarnessSpec(command=["true"]), SWE_SMITH) is None  # no section


def test_the_tasks_left_of_a_set_that_names_images_pass():
    """A resumed calibration checks only the tasks left: in a mixed set whose image tasks are done,
    those are host tasks without the field, and the set as a whole names its images."""
    harness = HarnessSpec(command=["true"], environment={**SECTION, "field": "image_name"})
    left = [{k: v for k, v in task.items() if k != "image_name"} for task in SWE_SMITH]
    done = {**SWE_SMITH[0], "image_name": "host"}
    assert check_environments(harness, left, whole=[*left, done]) == {"host": 2}
    with pytest.raises(ConfigError, match="none of the 2 task"):  # the set alone: refused (control)
        check_environments(harness, left, whole=left)


SHELL = "localhost/shell:1"  # /bin/sh and what harnessrl's Python and its modules load: passes the check


@needs_images
def test_a_mixed_set_and_a_default_image_pass(tiny_store: ImageStore, tmp_path: Path):
    modules = Path(sysconfig.get_paths()["stdlib"]) / "lib-dynload"
    programs = ("/bin/sh", "/usr/bin/cat", sys.executable, *map(str, sorted(modules.glob("*.so"))))
    tiny_store.podman.import_tar(tiny_tar(tmp_path / "shell.tar", programs), SHELL, labels={})
    config = EnvironmentConfig(field="image_name", images={"tiny": {"image": SHELL}})
    environments = Environments(config, store=tiny_store)
    defaulted = Environments(config.model_copy(update={"default": "tiny"}), store=tiny_store)
    try:
        mixed = [{**SWE_SMITH[0], "image_name": "tiny"}, {**SWE_SMITH[1], "image_name": None}]
        assert environments.check_tasks(mixed, NEEDS) == {"tiny": 1, "host": 1}
        unnamed = [{k: v for k, v in task.items() if k != "image_name"} for task in SWE_SMITH]
        assert defaulted.check_tasks(unnamed, NEEDS) == {"tiny": 2}
    finally:
        environments.close()
        defaulted.close()
