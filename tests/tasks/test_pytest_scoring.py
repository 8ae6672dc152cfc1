"""The generic pytest scorer (``harnessrl.tasks.pytest_scoring``) on a small repository with a bug,
run the way the command evaluator runs it (``scorer_sandbox``: bubblewrap, inputs copied under
``/run/harnessrl/inputs``): the fix scores 1, the bug 0, and code under test that forges pytest's
verdict from inside its process scores 0 with a flag — each attack next to its control, the same
attack against the same tests without the signal that catches it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tests.tasks.scorer_sandbox import PY, run_in_sandbox, sandbox_missing

from harnessrl.tasks.pytest_scoring import (
    DISAGREEMENT,
    REPORT_MISSING,
    TESTS_MISSING,
    TIMED_OUT,
    junit_key,
    verdict_flags,
)
from harnessrl.tasks.tripwires import Tripwire

needs_sandbox = pytest.mark.skipif(sandbox_missing() is not None, reason=str(sandbox_missing()))

SCORER = [PY, "-I", "-m", "harnessrl.tasks.pytest_scoring", "--files", "{files}", "--config", "pytest.ini"]
BUGGY = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
FIXED = BUGGY.replace("a - b", "a + b")
TESTS = """\
import pytest

from calc import add, mul


def test_add():
    assert add(2, 3) == 5


@pytest.mark.parametrize("a, b", [(1, 1), (2, 5)])
def test_add_many(a, b):
    assert add(a, b) == a + b


class TestMul:
    def test_mul(self):
        assert mul(3, 4) == 12
"""
FAIL_TO_PASS = ["tests/test_calc.py::test_add", "tests/test_calc.py::test_add_many[1-1]",
                "tests/test_calc.py::test_add_many[2-5]"]  # fmt: skip
PASS_TO_PASS = ["tests/test_calc.py::TestMul::test_mul"]
TASK = {"prompt": "fix add", "hidden": {"FAIL_TO_PASS": FAIL_TO_PASS, "PASS_TO_PASS": PASS_TO_PASS}}
PYTEST_INI = "[pytest]\npythonpath = .\n"


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, Path]:
    """(workspace with the bug and no tests, hidden files folder with the tests and pytest.ini)."""
    ws = tmp_path / "ws"
    (ws / "tests").mkdir(parents=True)
    (ws / "calc.py").write_text(BUGGY)
    files = tmp_path / "hidden" / "files"
    (files / "tests").mkdir(parents=True)
    (files / "tests" / "test_calc.py").write_text(TESTS)
    (files / "pytest.ini").write_text(PYTEST_INI)
    return ws, files


def score(ws: Path, files: Path, tmp_path: Path, command: list[str] = SCORER) -> dict:
    done = run_in_sandbox(
        command, workspace=ws, scratch=tmp_path / "eval", inputs={"files": files}, task=TASK
    )
    assert done.code == 0, done.stderr[-2000:]
    return done.last


def control(ws: Path, files: Path, tmp_path: Path, **run_pytest_kwargs: object) -> dict:
    """The scorer's own pytest run with one signal switched off, in the same sandbox."""
    script = textwrap.dedent(f"""
        import json, pathlib
        from harnessrl.tasks.pytest_scoring import restore_files, run_pytest, summary
        ws = pathlib.Path.cwd()
        restore_files(pathlib.Path("{{files}}"), ws)
        run = run_pytest(ws, {FAIL_TO_PASS + PASS_TO_PASS!r}, **{run_pytest_kwargs!r})
        print(json.dumps(summary(run, {FAIL_TO_PASS!r}, {PASS_TO_PASS!r})))
    """)
    return score(ws, files, tmp_path, [PY, "-I", "-c", script])


# --------------------------------------------------------------------------------------------------
# The verdict's rules, as a pure function
# --------------------------------------------------------------------------------------------------

WIRES = [Tripwire("t.py::test_07", False), Tripwire("t.py::test_42", True)]


def test_verdict_flags_refuse_every_contradiction():
    honest = {("t", "test_01"): "passed", ("t", "test_07"): "failed", ("t", "test_42"): "passed"}
    assert verdict_flags(honest, ["t.py::test_01"], WIRES, 1) == []
    assert verdict_flags(honest, ["t.py::test_01"], WIRES, 0) == [DISAGREEMENT]  # exit 0 with a failure
    assert verdict_flags(honest, ["t.py::test_01"], WIRES, None) == [TIMED_OUT]
    assert verdict_flags(None, ["t.py::test_01"], WIRES, 1) == [REPORT_MISSING]
    flipped = {**honest, ("t", "test_07"): "passed"}
    assert verdict_flags(flipped, ["t.py::test_01"], WIRES, 1) == [DISAGREEMENT]
    unaware = {("t", "test_01"): "passed"}  # a forged report that does not know the tripwires
    assert verdict_flags(unaware, ["t.py::test_01"], WIRES, 1) == [DISAGREEMENT]
    # A file that never ran (a collection error) loses its tests and its tripwires: missing, not forged.
    assert verdict_flags({}, ["t.py::test_01"], WIRES, 1) == [TESTS_MISSING]
    failing_pass_wire = {**honest, ("t", "test_42"): "failed"}
    assert verdict_flags(failing_pass_wire, ["t.py::test_01"], WIRES, 1) == [DISAGREEMENT]


def test_junit_keys_are_the_ones_pytest_writes():
    assert junit_key("tests/test_calc.py::TestMul::test_mul") == ("tests.test_calc.TestMul", "test_mul")
    assert junit_key("tests/test_calc.py::test_add_many[a::b-2]") == (
        "tests.test_calc",
        "test_add_many[a::b-2]",
    )
    assert junit_key("a/b/test_x.py::test_y") == ("a.b.test_x", "test_y")


# --------------------------------------------------------------------------------------------------
# Scoring, through the evaluator's sandbox
# --------------------------------------------------------------------------------------------------


@needs_sandbox
def test_fix_scores_1_bug_0_and_broken_files_0_without_a_forgery_flag(repo, tmp_path: Path):
    ws, files = repo
    buggy = score(ws, files, tmp_path / "bug")
    assert buggy["reward"] == 0.0 and buggy["flags"] == [] and buggy["fail_to_pass"] == "0/3"
    assert buggy["pass_to_pass"] == "1/1" and buggy["isolation"] == "landlock" and buggy["pytest_exit"] == 1

    (ws / "calc.py").write_text(FIXED)
    fixed = score(ws, files, tmp_path / "fix")
    assert fixed["reward"] == 1.0 and fixed["flags"] == [] and fixed["fail_to_pass"] == "3/3"
    # The tripwires ran in the test file and are gone from the verdict's lists.
    assert "def test_" in (ws / "tests" / "test_calc.py").read_text().split("class TestMul")[1]

    (ws / "calc.py").write_text("def add(:\n")  # the module does not import: tests missing, reward 0
    broken = score(ws, files, tmp_path / "broken")
    assert broken["reward"] == 0.0 and broken["flags"] == [TESTS_MISSING]


@needs_sandbox
def test_a_task_without_test_lists_is_the_scorers_failure(repo, tmp_path: Path):
    ws, files = repo
    done = run_in_sandbox(
        SCORER, workspace=ws, scratch=tmp_path / "e", inputs={"files": files}, task={"hidden": {}}
    )
    assert done.code == 2 and "no hidden.FAIL_TO_PASS" in done.stderr


@needs_sandbox
@pytest.mark.parametrize("shape", ["json_string", "bare_id"])
def test_test_lists_stored_as_a_string_are_read_as_test_ids_not_characters(repo, tmp_path: Path, shape):
    """Hugging Face exports store FAIL_TO_PASS / PASS_TO_PASS as a JSON-encoded string: it was read
    as its characters ("[", "t", ...), every one a missing test, so the fix scored 0 on every rollout
    with the policy's ``tests_missing`` flag. Control: the bug still scores 0."""
    ws, files = repo
    (ws / "calc.py").write_text(FIXED)
    f2p = json.dumps(FAIL_TO_PASS) if shape == "json_string" else FAIL_TO_PASS[0]
    task = {"hidden": {"FAIL_TO_PASS": f2p, "PASS_TO_PASS": json.dumps(PASS_TO_PASS)}}
    fixed = run_in_sandbox(SCORER, workspace=ws, scratch=tmp_path / "fix", inputs={"files": files}, task=task)
    assert fixed.code == 0, fixed.stderr[-2000:]
    assert fixed.last["reward"] == 1.0 and fixed.last["flags"] == [], fixed.last
    assert fixed.last["pass_to_pass"] == "1/1"
    (ws / "calc.py").write_text(BUGGY)
    buggy = run_in_sandbox(SCORER, workspace=ws, scratch=tmp_path / "bug", inputs={"files": files}, task=task)
    assert buggy.code == 0 and buggy.last["reward"] == 0.0 and buggy.last["flags"] == []


@needs_sandbox
@pytest.mark.parametrize("bad", [5, {"a": 1}, [["tests/test_calc.py::test_add"]], [""]], ids=repr)
def test_test_lists_of_another_shape_are_the_tasks_failure(repo, tmp_path: Path, bad):
    """A number was a TypeError traceback (exit 1); now exit 2 naming the field, as for no lists."""
    ws, files = repo
    task = {"hidden": {"FAIL_TO_PASS": FAIL_TO_PASS, "PASS_TO_PASS": bad}}
    done = run_in_sandbox(SCORER, workspace=ws, scratch=tmp_path / "e", inputs={"files": files}, task=task)
    assert done.code == 2 and "hidden.PASS_TO_PASS must be a list of test ids" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@needs_sandbox
def test_a_files_folder_without_a_fail_to_pass_file_is_the_tasks_failure(repo, tmp_path: Path):
    """The listed tests of a file the folder does not restore ran from the workspace's copy: the
    policy's edit ``def test_add(): pass`` scored 1 with the bug still in. Control: the same edit
    is overwritten when the folder holds the file."""
    ws, files = repo
    shutil.copytree(files, ws, dirs_exist_ok=True)
    rigged = TESTS.replace("assert add(", "assert True or add(")
    (ws / "tests" / "test_calc.py").write_text(rigged)
    assert score(ws, files, tmp_path / "control")["reward"] == 0.0  # restored: the bug fails
    (ws / "tests" / "test_calc.py").write_text(rigged)
    (files / "tests" / "test_calc.py").unlink()
    done = run_in_sandbox(SCORER, workspace=ws, scratch=tmp_path / "e", inputs={"files": files}, task=TASK)
    assert done.code == 2, (done.code, done.stdout[-1000:])
    assert "lacks tests/test_calc.py, which holds FAIL_TO_PASS tests" in done.stderr


PATCH_REPORTS = """
import sys as _sys

if "_pytest.reports" in _sys.modules:  # imported by pytest's collection: rewrite every failure
    _TR = _sys.modules["_pytest.reports"].TestReport
    _orig = _TR.__init__

    def _passing(self, *args, **kwargs):
        _orig(self, *args, **kwargs)
        if self.outcome == "failed":
            self.outcome, self.longrepr = "passed", None

    _TR.__init__ = _passing
"""


@needs_sandbox
def test_code_that_rewrites_pytest_reports_trips_the_tripwire(repo, tmp_path: Path):
    ws, files = repo
    (ws / "calc.py").write_text(BUGGY + PATCH_REPORTS)
    rigged = score(ws, files, tmp_path / "rigged")
    assert rigged["reward"] == 0.0 and DISAGREEMENT in rigged["flags"]
    assert rigged["fail_to_pass"] == "3/3"  # pytest's own report says every test passed...
    # ...and without the tripwires the scorer believes it.
    assert control(ws, files, tmp_path / "control", tripwires=False)["reward"] == 1.0


FORGE_REPORT = """
import os as _os, re as _re, sys as _sys

if "_pytest.reports" in _sys.modules:  # write pytest's JUnit report ourselves, every test passed, and leave
    _xml = _sys.argv[_sys.argv.index("--junitxml") + 1]
    _cases = []
    for _root, _, _names in _os.walk("tests"):
        for _name in [n for n in _names if n.endswith(".py")]:
            _module = _os.path.join(_root, _name)[:-3].replace("/", ".")
            _source = open(_os.path.join(_root, _name)).read()
            _cases += [(_module, n) for n in _re.findall(r"def (test_\\w+)", _source) if n != "test_add_many"]
    _cases += [("tests.test_calc", f"test_add_many[{p}]") for p in ("1-1", "2-5")]
    _cases += [("tests.test_calc.TestMul", "test_mul")]
    with open(_xml, "w") as _fh:
        _fh.write("<testsuites><testsuite>")
        _fh.writelines(f'<testcase classname="{c}" name="{n}"/>' for c, n in _cases)
        _fh.write("</testsuite></testsuites>")
    _os._exit(1)
"""


@needs_sandbox
def test_a_forged_report_gets_the_tripwires_wrong(repo, tmp_path: Path):
    ws, files = repo
    (ws / "calc.py").write_text(BUGGY + FORGE_REPORT)
    forged = score(ws, files, tmp_path / "forged")
    assert forged["reward"] == 0.0 and DISAGREEMENT in forged["flags"] and forged["pytest_exit"] == 1
    assert control(ws, files, tmp_path / "control", tripwires=False)["reward"] == 1.0


@needs_sandbox
def test_exiting_0_at_import_scores_0_where_pytest_exit_status_scores_1(repo, tmp_path: Path):
    ws, files = repo
    (ws / "calc.py").write_text(BUGGY + "\nimport os\nos._exit(0)\n")
    result = score(ws, files, tmp_path / "exit0")
    assert result["reward"] == 0.0 and result["flags"] == [REPORT_MISSING] and result["pytest_exit"] == 0
    # The pattern it replaces: restore the tests, exec pytest, reward = exit status 0.
    naive = run_in_sandbox(
        ["bash", "-c", "cp -r {files}/. . && exec python -I -m pytest -q -p no:cacheprovider --noconftest"],
        workspace=ws,
        scratch=tmp_path / "naive",
        inputs={"files": files},
        task=TASK,
    )
    assert naive.code == 0  # reward_from = "exit_code" gives 1.0


def test_the_cli_runs_outside_a_sandbox_too(repo, tmp_path: Path):
    """``sandbox = "none"``: the scorer still runs pytest in its own Landlock domain."""
    ws, files = repo
    shutil.copytree(files, ws, dirs_exist_ok=True)
    (ws / "calc.py").write_text(FIXED)
    task_file = tmp_path / "task.json"
    task_file.write_text(json.dumps(TASK))
    done = subprocess.run(
        [
            sys.executable,
            "-I",
            "-m",
            "harnessrl.tasks.pytest_scoring",
            str(task_file),
            "--config",
            "pytest.ini",
        ],
        cwd=ws,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["reward"] == 1.0
