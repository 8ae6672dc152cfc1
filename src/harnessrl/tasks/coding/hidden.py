"""Restoring a coding task's hidden tests into a workspace and running them: its reward.

This is what the task's evaluator runs, inside the rollout's sandbox (no network), after the harness
has exited. The policy may have edited, deleted or rigged any file in the workspace, so:

- every file of the task's hidden ``files/`` folder (the full test module, ``pytest.ini``) is copied
  over the workspace's version; a directory or symlink the policy put in its way is removed first;
- pytest runs as ``python -I -m pytest`` (isolated: the workspace is not on ``sys.path`` at start-up,
  so a ``pytest.py`` or ``sitecustomize.py`` there is ignored; ``PYTHON*`` variables are ignored)
  with ``-c pytest.ini --noconftest`` (no ``conftest.py`` anywhere is loaded: that is how a policy
  marks failing tests as passed), plugin auto-loading off, and no cache written;
- outcomes are read from a JUnit XML file written outside the workspace; a listed test missing from
  it (the run crashed, a module failed to import, the policy's code called ``os._exit``) counts as
  failed; a run over its time limit is killed and every test counts as failed.

Reward 1.0 only if every ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` test passed, else 0.0. Problems with
the task itself (no hidden folder) raise ``HiddenTestsError``: the evaluator's exit status is then
non-zero, which the controller treats as an infrastructure failure, not a reward of 0.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.errors import HarnessRLError
from harnessrl.tasks.fields import HIDDEN

# Passed to pytest from the evaluator's environment; everything else (PYTEST_ADDOPTS...) is dropped.
_ENV_KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR")


class HiddenTestsError(HarnessRLError):
    """The task's hidden tests are missing or unusable: not the policy's fault."""


@dataclass
class TestRun:
    outcomes: dict[str, str]  # test id -> passed | failed | skipped
    exit_code: int | None  # pytest's exit status; None when killed at the time limit
    timed_out: bool = False
    output: str = ""  # the tail of pytest's output
    missing: list[str] = field(default_factory=list)  # asked-for ids pytest never reported

    def passed(self, test_id: str) -> bool:
        return self.outcomes.get(test_id) == "passed"


def restore_files(hidden_files: Path, workspace: Path) -> list[str]:
    """Copy every file under ``hidden_files`` over the workspace; returns the restored relative paths."""
    if not hidden_files.is_dir():
        raise HiddenTestsError(f"hidden test files {str(hidden_files)!r} are missing")
    restored = []
    for src in sorted(p for p in hidden_files.rglob("*") if p.is_file()):
        rel = src.relative_to(hidden_files)
        target = workspace
        for part in rel.parts[:-1]:  # a symlinked or file-shaped parent would redirect the write
            target = target / part
            if target.is_symlink() or (target.exists() and not target.is_dir()):
                target.unlink()
            target.mkdir(exist_ok=True)
        target = target / rel.parts[-1]
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target)
        shutil.copyfile(src, target)
        restored.append(rel.as_posix())
    return restored


def run_tests(workspace: Path, test_ids: list[str], *, timeout_s: float = 60.0) -> TestRun:
    """Run the test files holding ``test_ids`` with pytest in ``workspace``; outcome per listed id."""
    files = sorted({test_id.split("::", 1)[0] for test_id in test_ids})
    env = {k: os.environ[k] for k in _ENV_KEEP if k in os.environ}
    env.update(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONDONTWRITEBYTECODE="1")
    with tempfile.TemporaryDirectory(prefix="harnessrl-hidden-") as tmp:
        xml_path, log_path = Path(tmp) / "junit.xml", Path(tmp) / "pytest.log"
        argv = [sys.executable, "-I", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", "pytest.ini"]
        argv += ["--rootdir", ".", "--noconftest", "--junitxml", str(xml_path), *files]
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                argv,
                cwd=workspace,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            timed_out = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                # Whatever the tests left running (a server, a forked child) dies with the group.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        output = log_path.read_bytes()[-4000:].decode(errors="replace")
        reported = {} if timed_out else _junit_outcomes(xml_path)
    outcomes = {test_id: reported.get(_junit_key(test_id), "failed") for test_id in test_ids}
    missing = [test_id for test_id in test_ids if _junit_key(test_id) not in reported]
    return TestRun(outcomes, None if timed_out else proc.returncode, timed_out, output, missing)


def _junit_key(test_id: str) -> tuple[str, str]:
    """``tests/test_x.py::test_y`` -> JUnit's (classname, name): ``("tests.test_x", "test_y")``."""
    path, _, name = test_id.partition("::")
    module = path[:-3] if path.endswith(".py") else path
    return module.replace("/", "."), name


def _junit_outcomes(xml_path: Path) -> dict[tuple[str, str], str]:
    if not xml_path.is_file():
        return {}
    try:
        root = ET.parse(xml_path).getroot()
    except ET.ParseError:
        return {}
    outcomes: dict[tuple[str, str], str] = {}
    for case in root.iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        # A test can be reported twice (a teardown error after a pass): any failure wins.
        if outcomes.get(key) != "failed":
            outcomes[key] = outcome
    return outcomes


def evaluate_task(
    task: dict[str, Any], hidden: Path, workspace: Path, *, timeout_s: float = 60.0
) -> dict[str, Any]:
    """Restore the hidden files, run FAIL_TO_PASS + PASS_TO_PASS (under the task's ``hidden``, as
    ``harnessrl.data.to_task`` puts them); the evaluator's JSON result."""
    hidden_data = task.get(HIDDEN) or {}
    fail_to_pass = [str(t) for t in hidden_data.get("FAIL_TO_PASS") or []]
    pass_to_pass = [str(t) for t in hidden_data.get("PASS_TO_PASS") or []]
    if not fail_to_pass:
        raise HiddenTestsError("the task lists no hidden.FAIL_TO_PASS tests")
    restore_files(hidden / "files", workspace)
    run = run_tests(workspace, fail_to_pass + pass_to_pass, timeout_s=timeout_s)
    failed = [t for t in fail_to_pass + pass_to_pass if not run.passed(t)]
    return {
        "reward": 0.0 if failed or run.timed_out else 1.0,
        "fail_to_pass": f"{sum(run.passed(t) for t in fail_to_pass)}/{len(fail_to_pass)}",
        "pass_to_pass": f"{sum(run.passed(t) for t in pass_to_pass)}/{len(pass_to_pass)}",
        "failed": failed[:20],
        "timed_out": run.timed_out,
        "pytest_exit": run.exit_code,
        "output_tail": run.output[-1000:],
    }
