"""The harness matrix inside a task image: unmodified harnesses run with the example's image
(``swe/inflection``: Debian bookworm, Python 3.11, pytest) as the sandbox's root, their install mounted
read-only from this machine (``harness.environment.harness = "host"``).

The same scripted task as ``test_matrix.py`` (create ``hello.txt``, read it back, finish): the file is
written through the harness's own shell tool, which now runs the image's ``sh``; every call is
recorded; the rollout records the image it ran on. mini-swe-agent (Python, the venv's interpreter)
and OpenCode and Claude Code (npm packages whose binaries are native ELF executables) — the two
kinds of install an image has to host.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.environments.image_support import environment_toml, environments, needs_images
from tests.harnesses.test_matrix import CASES, PROMPT, harness_or_skip, write_config

from harnessrl.store.sqlite import SQLiteStore

pytestmark = [pytest.mark.slow, needs_images]
IMAGE = "swe/inflection"
IN_IMAGE = [c for c in CASES if c.preset in ("mini-swe-agent", "opencode", "claude-code") and not c.env]


@pytest.mark.parametrize("case", IN_IMAGE, ids=[c.preset for c in IN_IMAGE])
def test_harness_does_the_task_inside_an_image(case, tmp_path: Path) -> None:
    harness_or_skip(case.preset)
    root = environments().root(IMAGE, where="the harness matrix")
    config = write_config(tmp_path, case)
    config.write_text(config.read_text() + "\n" + environment_toml(field="image_name"))
    task = {"prompt": PROMPT, "task_id": f"matrix-{case.preset}", "image_name": IMAGE}
    proc = subprocess.run(
        [sys.executable, "-m", "harnessrl", "rollout", "--config", str(config), "--task", json.dumps(task)]
        + ["--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    log = Path(summary["log"])
    context = f"{summary}\nstderr: {(log / 'stderr.log').read_text()[-2000:]}"
    assert summary["outcome"] == "success" and summary["reward"] == 1.0, context
    assert (log / "workspace" / "hello.txt").read_text() == "hi\n", context
    store = SQLiteStore(tmp_path / "run" / "harnessrl.db")
    try:
        rollout = store.get_rollout(summary["rollout_id"])
        calls = store.list_calls(rollout.rollout_id)
    finally:
        store.close()
    assert len(calls) == len(case.turns) and all(c.api == case.api for c in calls), context
    assert rollout.metadata["environment"] == {"image": root.name, "image_id": root.image_id[:12]}
