"""``harness.workdir`` (a template: a task may give it) outside the workspace is refused naming the
field. It was accepted: the harness started in its private ``/tmp`` or its home, did its work there,
and the scorer, which reads only the workspace, gave the finished rollout 0 ("success", no flag);
the Kubernetes runner started the same harness in the workspace instead; ``sub/../..`` failed every
attempt at launch as an infrastructure failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.cli.cli_support import invoke, refused

from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.harness import check_task

CONFIG = """[engine]
model = "scripted:{replies}"

[harness]
preset = "python"
command = ["-c", "open('answer.txt', 'w').write('42')"]
workdir = "{{task[dir]}}"

[evaluator]
type = "command"
command = ["test", "-f", "answer.txt"]
"""


@pytest.mark.parametrize("workdir", ["/tmp", "..", "../home", "sub/../..", "/rollout"])
def test_a_workdir_outside_the_workspace_is_refused_naming_the_field(tmp_path: Path, workdir: str) -> None:
    (tmp_path / "replies.json").write_text(json.dumps({"turns": ["done"]}))
    config = tmp_path / "rollout.toml"
    config.write_text(CONFIG.format(replies=tmp_path / "replies.json"))
    run_dir = tmp_path / "run"
    task = json.dumps({"prompt": "hi", "dir": workdir})
    result = invoke("rollout", "--config", str(config), "--task", task, "--run-dir", str(run_dir))
    refused(result, "harness.workdir", f"{workdir!r} is outside the workspace")
    assert not run_dir.exists()


@pytest.mark.parametrize("workdir", [".", "sub", "./sub/../sub", "{workspace}/sub"])
def test_a_workdir_in_the_workspace_passes(workdir: str) -> None:
    spec = HarnessSpec(command=["true"], workdir=workdir, files={"sub/keep.txt": "x"})
    check_task(spec, {"prompt": "hi"})
