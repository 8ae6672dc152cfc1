"""The coding tasks' scorer against code under test that attacks it, run the way the command evaluator
runs it (``scorer_sandbox``: bubblewrap, the hidden folder copied to ``/run/harnessrl/inputs``, the
task file at ``/run/harnessrl/task.json``). The code under test is ``solution.py``: what the policy
wrote, imported by the scorer's children. Each attack gets reward 0 (and a flag where the scorer can
tell), next to its control: the same attack against a scorer without the defence, which it beats.

Calibration first: a scripted policy that applies each task's gold patch earns 1 on every task, and
the unfixed bug 0, with no flags.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import textwrap
import tomllib
from pathlib import Path

import pytest
from tests.tasks.coding_support import build_outside_tmp, records
from tests.tasks.scorer_sandbox import PY, Scored, run_in_sandbox, sandbox_missing

from harnessrl.controller.evaluators import build_evaluator
from harnessrl.controller.evaluators.types import EvaluationInput
from harnessrl.data.records import to_task
from harnessrl.tasks.pytest_scoring import DISAGREEMENT, REPORT_MISSING

pytestmark = pytest.mark.skipif(sandbox_missing() is not None, reason=str(sandbox_missing()))

SCORER = [PY, "-I", "-m", "harnessrl.tasks.coding", "evaluate", "--hidden", "{hidden}"]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "coding" / "train.toml"


@pytest.fixture(scope="module")
def task_set():
    out = build_outside_tmp("--limit", "3")
    yield out
    shutil.rmtree(out.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def row(task_set: Path) -> dict:
    """humaneval__0.m00 (``has_close_elements``): 3 FAIL_TO_PASS, 4 PASS_TO_PASS, all 7 probed."""
    first = records(task_set)[0]
    assert first["instance_id"] == "humaneval__0.m00"
    return first


def workspace(row: dict, dest: Path, *, gold_patch: Path | None = None, append: str = "") -> Path:
    """The task's repository as the policy leaves it: the bug, optionally the gold patch applied (what a
    scripted fixing policy does) and code appended to ``solution.py``."""
    shutil.copytree(row["hidden"]["repo_path"], dest)
    if gold_patch is not None:
        subprocess.run(["git", "apply", str(gold_patch)], cwd=dest, check=True)
    if append:
        with (dest / "solution.py").open("a") as fh:
            fh.write(append)
    return dest


def score(row: dict, ws: Path, scratch: Path, command: list[str] = SCORER, **inputs: Path) -> Scored:
    inputs = {"hidden": Path(row["hidden"]["tests"]), **inputs}
    return run_in_sandbox(command, workspace=ws, scratch=scratch, inputs=inputs, task=to_task(row))


def verdict(done: Scored) -> dict:
    assert done.code == 0, done.stderr[-2000:]
    return done.last


def control(row: dict, ws: Path, scratch: Path, script: str) -> Scored:
    """A control script in the scorer's place, same sandbox, same inputs; it is passed ``--hidden`` and
    the hidden folder's path as arguments, like the scorer."""
    return score(row, ws, scratch, [PY, "-I", "-c", textwrap.dedent(script), "--hidden", "{hidden}"])


def test_the_gold_patch_earns_1_on_every_task_and_the_bug_0(task_set: Path, tmp_path: Path):
    rows = records(task_set)
    assert len(rows) == 3
    for r in rows:
        gold = task_set / "gold" / r["instance_id"] / "gold.patch"
        fixed = verdict(
            score(
                r,
                workspace(r, tmp_path / r["instance_id"] / "ws", gold_patch=gold),
                tmp_path / r["instance_id"] / "fix",
            )
        )
        assert fixed["reward"] == 1.0 and fixed["flags"] == [] and fixed["isolation"] == "landlock", fixed
        assert (
            fixed["probes"]["disagree"] == [] and fixed["probes"]["passed"] == fixed["probes"]["checked"] > 0
        )
        buggy = verdict(
            score(r, workspace(r, tmp_path / r["instance_id"] / "bug"), tmp_path / r["instance_id"] / "b")
        )
        assert buggy["reward"] == 0.0 and buggy["flags"] == [], buggy
        assert buggy["fail_to_pass"] == f"0/{len(r['FAIL_TO_PASS'])}"


# --------------------------------------------------------------------------------------------------
# (a) Reading the hidden tests, the expected values or the task file, and answering from them
# --------------------------------------------------------------------------------------------------

READ_ANSWERS = '''
import ast as _ast, json as _json, os as _os

_TABLE = {}
_HERE = _os.path.dirname(_os.path.abspath(__file__))


def _note(line):
    with open(_os.path.join(_HERE, "attack.log"), "a") as fh:
        fh.write(line + "\\n")


def _remember(call, expected):
    try:
        _TABLE[repr(tuple(_ast.literal_eval(a) for a in call.args))] = _ast.literal_eval(expected)
    except (ValueError, SyntaxError, TypeError):
        pass


def _learn(text):
    try:
        probes = _json.loads(text)["probes"]
    except (ValueError, KeyError, TypeError):
        probes = None
    if probes is not None:  # scoring.json: the probed calls and the gold values
        for p in probes:
            if p.get("expected"):
                _remember(_ast.parse(p["source"]).body[0].body[-1].value, _ast.parse(p["expected"], mode="eval").body)
        return
    try:
        tree = _ast.parse(text)
    except SyntaxError:
        return
    for node in _ast.walk(tree):  # a test module: assert candidate(...) == expected
        if isinstance(node, _ast.Compare) and isinstance(node.left, _ast.Call):
            if getattr(node.left.func, "id", "") == "candidate":
                _remember(node.left, node.comparators[0])


def _targets():
    """Where the answers are: the scorer's inputs (named in its command line), its task file, the tests."""
    found = {"/run/harnessrl/task.json", _os.path.join(_HERE, "tests", "test_solution.py")}
    for pid in [p for p in _os.listdir("/proc") if p.isdigit()]:
        try:
            args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
        except OSError:
            continue
        for flag, value in zip(args, args[1:]):
            if flag == b"--hidden":
                root = value.decode()
                found |= {root + "/scoring.json", root + "/files/tests/test_solution.py"}
    return sorted(found)


for _path in _targets():
    try:
        with open(_path) as _fh:
            _text = _fh.read()
    except OSError as _exc:
        _note(f"denied {_path} {type(_exc).__name__}")
        continue
    _note(f"read {_path}")
    _learn(_text)

_buggy = has_close_elements


def has_close_elements(*args):
    key = repr(args)
    return _TABLE[key] if key in _TABLE else _buggy(*args)
'''


def test_code_that_reads_the_answers_finds_none_and_is_flagged(row: dict, tmp_path: Path):
    ws = workspace(row, tmp_path / "ws", append=READ_ANSWERS)
    result = verdict(score(row, ws, tmp_path / "scored"))
    assert result["reward"] == 0.0 and DISAGREEMENT in result["flags"]
    # The probes ran first, in their own domain: nothing to read, the bug's values.
    assert result["probes"]["passed"] == 4 and result["probes"]["disagree"] != []
    log = (ws / "attack.log").read_text()
    assert "denied /run/harnessrl/inputs/0/humaneval__0.m00/scoring.json PermissionError" in log
    assert "denied /run/harnessrl/task.json PermissionError" in log
    assert "read /run/harnessrl/" not in log
    # pytest ran later, over the restored tests: there the code read them and "passed" everything,
    # which is what the disagreement flag catches.
    assert sorted(result["probes"]["disagree"]) == sorted(row["FAIL_TO_PASS"])
    assert result["fail_to_pass"] == "0/3" and f"read {ws}/tests/test_solution.py" in log

    # Control: the same probes from a child outside run_scored's domain read the answers and pass.
    ws = workspace(row, tmp_path / "ws-control", append=READ_ANSWERS)
    done = control(
        row,
        ws,
        tmp_path / "control",
        """
        import json, pathlib, sys
        from harnessrl.tasks.coding import probes
        spec = probes.load(pathlib.Path(sys.argv[2]))
        run = probes.run_probes(pathlib.Path.cwd(), spec.recorded(), spec, timeout_s=60, isolated=False)
        print(json.dumps(probes.verdicts(run, spec.recorded())))
        """,
    )
    assert done.code == 0, done.stderr[-2000:]
    assert list(done.last.values()) == [True] * 7  # every probe, the 3 failing ones included
    log = (ws / "attack.log").read_text()
    assert "read /run/harnessrl/inputs/0/humaneval__0.m00/scoring.json" in log
    assert "read /run/harnessrl/task.json" in log


# --------------------------------------------------------------------------------------------------
# (b) os._exit(0) at import
# --------------------------------------------------------------------------------------------------


def test_exiting_0_at_import_scores_0_where_the_exec_pytest_pattern_scores_1(row: dict, tmp_path: Path):
    ws = workspace(row, tmp_path / "ws", append="\nimport os\nos._exit(0)\n")
    result = verdict(score(row, ws, tmp_path / "scored"))
    assert result["reward"] == 0.0 and REPORT_MISSING in result["flags"] and result["probes"]["passed"] == 0
    # Control: restore the tests, exec pytest, reward from its exit status (the old recommended pattern).
    ws = workspace(row, tmp_path / "ws-naive", append="\nimport os\nos._exit(0)\n")
    naive = score(
        row,
        ws,
        tmp_path / "naive",
        [
            "bash",
            "-c",
            "cp -r {hidden}/files/. . && exec python -I -m pytest -q -p no:cacheprovider --noconftest",
        ],
    )
    assert naive.code == 0  # reward_from = "exit_code": 1.0


# --------------------------------------------------------------------------------------------------
# (c) Rewriting pytest's reports from the imported module (no conftest, no option, no plugin file)
# --------------------------------------------------------------------------------------------------

PATCH_REPORTS = '''
import ast as _ast, sys as _sys

def _real_tests():
    """Test functions that call the function under test: the suite's own, not anything else in the file."""
    tree = _ast.parse(open("tests/test_solution.py").read())
    return {f.name for f in tree.body if isinstance(f, _ast.FunctionDef)
            and any(getattr(n, "id", "") == "candidate" for n in _ast.walk(f))}

def _spared(name):
    """TARGETED: True = the suite's own tests only; "pattern" = names shaped like them; False = all."""
    if TARGETED == "pattern":
        import re
        return re.fullmatch(r"test_check_[0-9]+", name) is not None
    return _ONLY is None or name in _ONLY

if "_pytest.reports" in _sys.modules:
    _TR = _sys.modules["_pytest.reports"].TestReport
    _orig = _TR.__init__
    _ONLY = _real_tests() if TARGETED is True else None

    def _passing(self, *args, **kwargs):
        _orig(self, *args, **kwargs)
        if self.outcome == "failed" and _spared(self.nodeid.split("::")[-1]):
            self.outcome, self.longrepr = "passed", None

    _TR.__init__ = _passing
'''
GENERIC = [PY, "-I", "-m", "harnessrl.tasks.pytest_scoring", "--hidden", "{hidden}", "--config", "pytest.ini"]


def test_code_that_rewrites_every_report_trips_the_tripwires(row: dict, tmp_path: Path):
    attack = "\nTARGETED = False\n" + PATCH_REPORTS
    coding = verdict(score(row, workspace(row, tmp_path / "ws1", append=attack), tmp_path / "coding"))
    assert coding["reward"] == 0.0 and DISAGREEMENT in coding["flags"]
    assert sorted(coding["probes"]["disagree"]) == sorted(row["FAIL_TO_PASS"])
    generic = verdict(
        score(row, workspace(row, tmp_path / "ws2", append=attack), tmp_path / "generic", GENERIC)
    )
    assert generic["reward"] == 0.0 and generic["flags"] == [DISAGREEMENT]
    # Control: the generic scorer's own run without tripwires believes pytest.
    done = control(
        row,
        workspace(row, tmp_path / "ws3", append=attack),
        tmp_path / "control",
        f"""
        import json, pathlib, sys
        from harnessrl.tasks.pytest_scoring import restore_files, run_pytest, summary
        ws = pathlib.Path.cwd()
        restore_files(pathlib.Path(sys.argv[2]) / "files", ws)
        f2p, p2p = {row["FAIL_TO_PASS"]!r}, {row["PASS_TO_PASS"]!r}
        print(json.dumps(summary(run_pytest(ws, f2p + p2p, tripwires=False), f2p, p2p)))
        """,
    )
    assert done.code == 0, done.stderr[-2000:]
    assert done.last["reward"] == 1.0 and done.last["flags"] == []


def test_a_rewrite_by_name_pattern_trips_the_tripwires_shaped_like_the_tests(row: dict, tmp_path: Path):
    """Code that spares only names shaped like the suite's (``test_check_NN``) still flips the
    tripwires, which are named that way too."""
    attack = '\nTARGETED = "pattern"\n' + PATCH_REPORTS
    generic = verdict(
        score(row, workspace(row, tmp_path / "ws1", append=attack), tmp_path / "generic", GENERIC)
    )
    assert generic["reward"] == 0.0 and generic["flags"] == [DISAGREEMENT]
    text = (tmp_path / "ws1" / "tests" / "test_solution.py").read_text()
    wires = [n for n in re.findall(r"^def (test_check_\d+)\(", text, re.M) if f"::{n}" not in str(row)]
    # The tripwires the scorer planted (one to three of each kind), named like the suite's tests.
    assert 2 <= len(wires) <= 6
    # Control: without tripwires the same code passes.
    done = control(
        row,
        workspace(row, tmp_path / "ws2", append=attack),
        tmp_path / "control",
        f"""
        import json, pathlib, sys
        from harnessrl.tasks.pytest_scoring import restore_files, run_pytest, summary
        ws = pathlib.Path.cwd()
        restore_files(pathlib.Path(sys.argv[2]) / "files", ws)
        f2p, p2p = {row["FAIL_TO_PASS"]!r}, {row["PASS_TO_PASS"]!r}
        print(json.dumps(summary(run_pytest(ws, f2p + p2p, tripwires=False), f2p, p2p)))
        """,
    )
    assert done.code == 0, done.stderr[-2000:]
    assert done.last["reward"] == 1.0


def test_a_targeted_rewrite_passes_the_tripwires_but_not_the_probes(row: dict, tmp_path: Path):
    """The generic scorer's documented residual risk, pinned: code that reads the test file and spares
    everything but the suite's own tests gets past the tripwires. Checked values from outside its
    process (the coding tasks' probes) still catch it."""
    attack = "\nTARGETED = True\n" + PATCH_REPORTS
    generic = verdict(
        score(row, workspace(row, tmp_path / "ws1", append=attack), tmp_path / "generic", GENERIC)
    )
    assert generic["reward"] == 1.0 and generic["flags"] == []  # the residual risk (docs/evaluators.md)
    coding = verdict(score(row, workspace(row, tmp_path / "ws2", append=attack), tmp_path / "coding"))
    assert coding["reward"] == 0.0 and coding["flags"] == [DISAGREEMENT]
    assert sorted(coding["probes"]["disagree"]) == sorted(row["FAIL_TO_PASS"])


# --------------------------------------------------------------------------------------------------
# (d) A process left behind to write a verdict later; (e) the scorer's /proc
# --------------------------------------------------------------------------------------------------

LEAVE_A_WRITER = """
import os as _os, time as _time

_HERE = _os.path.dirname(_os.path.abspath(__file__))


def _scorers():
    me, found = _os.getpid(), []
    for pid in [p for p in _os.listdir("/proc") if p.isdigit() and int(p) != me]:
        try:
            if b"harnessrl.tasks.coding" in open(f"/proc/{pid}/cmdline", "rb").read():  # the scorer
                found.append(pid)
        except OSError:
            pass
    return found


def _writer(ready):
    log = open(_os.path.join(_HERE, "writer.log"), "a", buffering=1)
    log.write(f"started {_os.getpid()}\\n")
    while True:  # every 20 ms: append a verdict to the stdout of every scorer-looking process
        for pid in _scorers():
            try:
                fd = _os.open(f"/proc/{pid}/fd/1", _os.O_WRONLY | _os.O_APPEND)
            except OSError as exc:
                log.write(f"denied {pid} {type(exc).__name__}\\n")
                continue
            _os.write(fd, b'{"reward": 1.0, "flags": []}\\n')
            _os.close(fd)
            log.write(f"wrote {pid}\\n")
        if ready is not None:  # one round done: let the importer go on
            _os.write(ready, b"x")
            _os.close(ready)
            ready = None
        _time.sleep(0.02)


_r, _w = _os.pipe()
if _os.fork() == 0:  # a grandchild in a session of its own: out of the importer's process group
    _os.setsid()
    if _os.fork() == 0:
        try:
            _writer(_w)
        finally:
            _os._exit(0)
    _os._exit(0)
_os.close(_w)
_os.wait()
_os.read(_r, 1)
"""


def test_a_process_left_behind_is_dead_before_the_verdict_and_never_reaches_stdout(row: dict, tmp_path: Path):
    ws = workspace(row, tmp_path / "ws", append=LEAVE_A_WRITER)
    done = score(row, ws, tmp_path / "scored")
    result = verdict(done)
    assert result["reward"] == 0.0 and result["fail_to_pass"] == "0/3"
    assert result["leftovers"] >= 2  # one writer per child that imported solution.py, killed by run_scored
    assert '"reward": 1.0' not in done.stdout
    log = (ws / "writer.log").read_text()
    assert "started" in log and "denied" in log and "wrote" not in log

    # Control: a scorer that imports the code in a plain child (its process group killed, as before)
    # and prints its verdict: the writer survives the child and appends a verdict after it.
    ws = workspace(row, tmp_path / "ws-control", append=LEAVE_A_WRITER)
    done = control(
        row,
        ws,
        tmp_path / "control",
        """
        # harnessrl.tasks.coding (what the code looks for in a command line)
        import json, pathlib, sys, time
        from harnessrl.tasks.scored_child import child_env, run_child
        ws = pathlib.Path.cwd()
        run_child([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, ''); import solution"],
                  cwd=ws, env=child_env(pathlib.Path("/tmp")), timeout_s=30, isolated=False)
        print(json.dumps({"reward": 0.0}), flush=True)
        log = ws / "writer.log"
        seen = log.read_text().count("wrote")
        deadline = time.monotonic() + 60
        while log.read_text().count("wrote") <= seen and time.monotonic() < deadline:
            time.sleep(0.01)  # wait for a write that lands after our verdict
        """,
    )
    assert done.code == 0, done.stderr[-2000:]
    assert done.last == {"reward": 1.0, "flags": []}  # the last line a json evaluator reads is forged


READ_THE_SCORER = """
import os as _os

_HERE = _os.path.dirname(_os.path.abspath(__file__))
with open(_os.path.join(_HERE, "proc.log"), "a") as _log:
    for _pid in [p for p in _os.listdir("/proc") if p.isdigit() and int(p) != _os.getpid()]:
        try:
            if b"harnessrl.tasks.coding" not in open(f"/proc/{_pid}/cmdline", "rb").read():
                continue
        except OSError:
            continue
        _log.write(f"target {_pid}\\n")
        try:
            _log.write(f"environ read {len(open(f'/proc/{_pid}/environ', 'rb').read())}\\n")
        except OSError as exc:
            _log.write(f"environ denied {type(exc).__name__}\\n")
        try:
            _fd = _os.open(f"/proc/{_pid}/fd/1", _os.O_WRONLY | _os.O_APPEND)
            _os.write(_fd, b'{"reward": 1.0, "flags": []}\\n')
            _os.close(_fd)
            _log.write("fd1 wrote\\n")
        except OSError as exc:
            _log.write(f"fd1 denied {type(exc).__name__}\\n")
        try:
            _os.close(_os.open(f"/proc/{_pid}/mem", _os.O_RDWR))
            _log.write("mem opened\\n")
        except OSError as exc:
            _log.write(f"mem denied {type(exc).__name__}\\n")
"""


def test_the_scorers_environ_stdout_and_memory_are_closed_to_the_code(row: dict, tmp_path: Path):
    ws = workspace(row, tmp_path / "ws", append=READ_THE_SCORER)
    done = score(row, ws, tmp_path / "scored")
    assert verdict(done)["reward"] == 0.0 and '"reward": 1.0' not in done.stdout
    log = (ws / "proc.log").read_text()
    assert (
        "target" in log and "environ read" not in log and "fd1 wrote" not in log and "mem opened" not in log
    )
    assert "environ denied PermissionError" in log and "fd1 denied PermissionError" in log

    # Control: the same code imported by a plain child of a (dumpable) scorer-like process.
    ws = workspace(row, tmp_path / "ws-control", append=READ_THE_SCORER)
    done = control(
        row,
        ws,
        tmp_path / "control",
        """
        # harnessrl.tasks.coding (what the code looks for in a command line)
        import pathlib, sys
        from harnessrl.tasks.scored_child import child_env, run_child
        run_child([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, ''); import solution"],
                  cwd=pathlib.Path.cwd(), env=child_env(pathlib.Path("/tmp")), timeout_s=30, isolated=False)
        """,
    )
    assert done.code == 0, done.stderr[-2000:]
    log = (ws / "proc.log").read_text()
    assert "environ read" in log and "fd1 wrote" in log
    assert done.last == {"reward": 1.0, "flags": []}


# --------------------------------------------------------------------------------------------------
# Through the command evaluator itself, with the example's [evaluator] section
# --------------------------------------------------------------------------------------------------


def test_the_example_evaluator_records_the_scorers_flags(row: dict, task_set: Path, tmp_path: Path):
    evaluator = build_evaluator(tomllib.loads(EXAMPLE.read_text())["evaluator"])

    def evaluate(ws: Path):
        return asyncio.run(
            evaluator.evaluate(EvaluationInput(task=to_task(row), workspace=ws, rollout_id="r"))
        )

    gold = task_set / "gold" / row["instance_id"] / "gold.patch"
    fixed = evaluate(workspace(row, tmp_path / "gold", gold_patch=gold))
    assert fixed.reward == 1.0 and fixed.flags == (), fixed.details
    assert fixed.details["output"]["fail_to_pass"] == "3/3"
    rigged = evaluate(workspace(row, tmp_path / "rigged", append="\nTARGETED = False\n" + PATCH_REPORTS))
    assert rigged.reward == 0.0 and DISAGREEMENT in rigged.flags
    exited = evaluate(workspace(row, tmp_path / "exit", append="\nimport os\nos._exit(0)\n"))
    assert exited.reward == 0.0 and REPORT_MISSING in exited.flags
