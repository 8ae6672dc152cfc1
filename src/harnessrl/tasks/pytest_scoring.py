"""A scorer for repository test suites that the code under test cannot talk into a pass.

``python -I -m harnessrl.tasks.pytest_scoring [--hidden DIR | --files DIR] [--config FILE] [TASK_FILE]``
is a command evaluator's scorer for SWE-smith-style tasks: it restores the task's test files
(``DIR/files/`` of the hidden folder, or ``--files DIR`` itself) over the workspace,
runs the tests named in ``hidden.FAIL_TO_PASS`` and ``hidden.PASS_TO_PASS`` with pytest, and prints
``{"reward": 0.0 | 1.0, "flags": [...], ...}`` as its last line. Reward 1 only if every listed test
passed *and* nothing about the run contradicts that.

pytest runs in the process that imports the code under test, so its verdict is that code's to
rewrite (``os._exit(0)`` at import, a patched ``TestReport``, a forged JUnit file). What this scorer
does about it:

- pytest runs through ``harnessrl.sandbox.scored.run_scored``: in a Landlock domain of its own that
  cannot read this scorer's inputs, write its stdout, signal it or outlive ``run_scored``;
- isolated: ``python -I -m pytest`` (no workspace ``pytest.py``/``sitecustomize.py``, no ``PYTHON*``
  variables), ``--noconftest``, plugin auto-loading off, ``-o addopts=`` (the workspace's config
  cannot add options), no cache; outcomes come from pytest's JUnit XML, read only once every
  process of the run is dead;
- **tripwires** (``harnessrl.tasks.tripwires``): before the run, one to three tests that must fail
  and one to three that must pass, with fresh random names shaped like the suite's own, are planted
  at random positions beside the listed tests: in each class holding one (as its methods), at the
  top level for top-level ones, parametrized with a copied id where every listed test of the place
  is. Code that does not know them cannot forge a report that gets them right. The verdict is refused (reward 0, flag ``verdict_disagreement``) when a must-fail tripwire passed, a tripwire
  is missing from a file whose tests were reported, or pytest exited 0 (the must-fail tripwire
  makes an honest run exit 1); ``report_missing`` when there is no readable report,
  ``tests_missing`` when a listed test was never reported (an import error, a deleted file),
  ``tests_timed_out`` when the run was killed at its time limit.

Residual risk, precisely: code that reads the test files at run time can tell the tripwires apart
(their bodies are not the suite's) and rewrite only the outcomes of the real tests; tripwires catch
code that rewrites reports wholesale or by name pattern, not code written against this scorer.
Where assertions can be checked outside the process (``harnessrl.tasks.coding``'s probes), they
are. ``docs/evaluators.md`` says how to use this scorer.

Exit status 2 (the controller's "scorer failed": reward 0, flagged) only when the task itself is
broken (no test lists, no files folder, a files folder without the file of a ``FAIL_TO_PASS``
test); never because of the code under test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.errors import HarnessRLError
from harnessrl.tasks.fields import HIDDEN
from harnessrl.tasks.scored_child import child_env, run_child
from harnessrl.tasks.tripwires import Tripwire, plant_tripwires

# Flags in the scorer's JSON output (the controller records them with the rollout).
DISAGREEMENT = "verdict_disagreement"  # independent signals contradict the in-process verdict
REPORT_MISSING = "report_missing"  # no readable JUnit report: the run was cut short or tampered with
TESTS_MISSING = "tests_missing"  # a listed test was never reported
TIMED_OUT = "tests_timed_out"  # the run was killed at its time limit
WEAK_ISOLATION = "weak_isolation"  # no Landlock, or one without signal scoping (ABI < 6): informational

_REPORT_LIMIT = 64 << 20  # bytes of JUnit XML read: more is no report


class ScoringError(HarnessRLError):
    """The task or the scorer's inputs are unusable: not the scored code's doing."""


def restore_files(files: Path, workspace: Path) -> list[str]:
    """Copy every file under ``files`` over the workspace (a directory, link or file in the way is
    removed first, so no write follows a link the policy planted); returns the relative paths."""
    if not files.is_dir():
        raise ScoringError(f"the test files folder {str(files)!r} is missing")
    restored = []
    for src in sorted(p for p in files.rglob("*") if p.is_file()):
        rel = src.relative_to(files)
        target = workspace
        for part in rel.parts[:-1]:
            target = target / part
            if target.is_symlink() or (target.exists() and not target.is_dir()):
                target.unlink()
            target.mkdir(exist_ok=True)
        target = target / rel.parts[-1]
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target)
        elif target.exists():  # a FIFO or socket
            target.unlink()
        shutil.copyfile(src, target)
        restored.append(rel.as_posix())
    return restored


# --------------------------------------------------------------------------------------------------
# Running pytest and reading its verdict
# --------------------------------------------------------------------------------------------------


@dataclass
class TestRun:
    outcomes: dict[str, str]  # listed test id -> passed | failed | skipped | missing
    exit_code: int | None  # pytest's exit status; None when killed at the time limit
    timed_out: bool = False
    output: str = ""  # the tail of pytest's output
    flags: list[str] = field(default_factory=list)
    isolation: str = "none"
    leftovers: int = 0

    def passed(self, test_id: str) -> bool:
        return self.outcomes.get(test_id) == "passed"

    @property
    def missing(self) -> list[str]:
        return [t for t, outcome in self.outcomes.items() if outcome == "missing"]


def junit_key(test_id: str) -> tuple[str, str]:
    """A pytest node id as JUnit's (classname, name), the way pytest's ``junitxml`` writes it:
    ``tests/test_x.py::TestA::test_b[1]`` -> ``("tests.test_x.TestA", "test_b[1]")``."""
    path, bracket, params = test_id.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def read_junit(path: Path) -> dict[tuple[str, str], str] | None:
    """Outcome per (classname, name), any failure of a test winning; None when there is no readable
    report (missing, not a plain file, too large, declarations pytest never writes, bad XML)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not os.path.isfile(f"/proc/self/fd/{fd}") or os.fstat(fd).st_size > _REPORT_LIMIT:
            return None
        data = fh.read(_REPORT_LIMIT + 1)
    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:
        return None
    try:
        root = ET.fromstring(data)
    except ET.ParseError:
        return None
    outcomes: dict[tuple[str, str], str] = {}
    for case in root.iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        if outcomes.get(key) != "failed":  # a pass, then a teardown error: failed
            outcomes[key] = outcome
    return outcomes


def verdict_flags(
    reported: dict[tuple[str, str], str] | None,
    test_ids: Sequence[str],
    tripwires: Sequence[Tripwire],
    exit_code: int | None,
) -> list[str]:
    """What contradicts the report (a pure function of what the run left)."""
    if exit_code is None:
        return [TIMED_OUT]
    if reported is None:
        return [REPORT_MISSING]
    flags = []
    if any(junit_key(t) not in reported for t in test_ids):
        flags.append(TESTS_MISSING)
    seen_files = {t.split("::", 1)[0] for t in test_ids if junit_key(t) in reported}
    for wire in tripwires:
        outcome = reported.get(junit_key(wire.test_id))
        if outcome is None:
            wrong = wire.test_id.split("::", 1)[0] in seen_files  # its file ran, it did not
        else:
            wrong = (outcome == "passed") != wire.must_pass
        if wrong:
            flags.append(DISAGREEMENT)
            break
    if tripwires and exit_code == 0:  # a must-fail tripwire ran: an honest pytest exits 1
        flags.append(DISAGREEMENT)
    return list(dict.fromkeys(flags))


def run_pytest(
    workspace: Path,
    test_ids: Sequence[str],
    *,
    timeout_s: float = 60.0,
    config: str | None = "pytest.ini",
    isolated: bool = True,
    tripwires: bool = True,
    python: str | None = None,
) -> TestRun:
    """Run the files holding ``test_ids`` with pytest in ``workspace``: outcome per listed id, and the
    flags of ``verdict_flags``. ``config`` is the ini file (relative to the workspace) pytest reads.
    ``python`` is the interpreter that runs pytest (default: this one); a task's image has its own,
    with the project's test dependencies (docs/environments.md)."""
    test_ids = list(dict.fromkeys(test_ids))
    wires = plant_tripwires(workspace, test_ids) if tripwires else []
    files = sorted({t.split("::", 1)[0] for t in test_ids})
    with tempfile.TemporaryDirectory(prefix="harnessrl-pytest-") as tmp:
        scratch = Path(tmp)  # the scored code's own (pytest writes its report here): untrusted
        xml_path = scratch / "junit.xml"
        # -I ignores PYTHON* variables: -B (no bytecode written into the workspace) is the flag's job.
        interpreter = python or sys.executable
        argv = [interpreter, "-I", "-B", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest"]
        argv += ["-o", "addopts=", "--continue-on-collection-errors", "--rootdir", "."]
        argv += [*(["-c", config] if config else []), "--junitxml", str(xml_path), "--", *files]
        run = run_child(
            argv,
            cwd=workspace,
            env=child_env(scratch),
            timeout_s=timeout_s,
            writable=(scratch,),
            isolated=isolated,
            output_limit=4000,
            readable=_install_of(interpreter),
        )
        reported = None if run.timed_out else read_junit(xml_path)  # every process of the run is dead
    flags = verdict_flags(reported, test_ids, wires, run.exit_code)
    if isolated and run.isolation != "landlock":
        flags.append(WEAK_ISOLATION)
    outcomes = {t: (reported or {}).get(junit_key(t), "missing") for t in test_ids}
    return TestRun(
        outcomes,
        run.exit_code,
        run.timed_out,
        run.output.decode(errors="replace"),
        flags,
        run.isolation,
        run.leftovers,
    )


# --------------------------------------------------------------------------------------------------
# The scorer
# --------------------------------------------------------------------------------------------------

# Flags that leave the reward alone (informational); every other flag zeroes it.
INFORMATIONAL = frozenset({WEAK_ISOLATION})


def test_lists(task: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``hidden.FAIL_TO_PASS`` and ``hidden.PASS_TO_PASS``: lists of test ids (as
    ``harnessrl.data.to_task`` puts them), or, as Hugging Face exports of SWE-bench-style sets store
    them, a JSON-encoded list or one bare test id (``harnessrl.data.records.tests_of`` reads the
    same shapes). A string was iterated as its characters: every listed "test" was missing, so the
    fix scored 0 on every rollout, flagged as the policy's ``tests_missing``. Anything else is the
    task's error (``ScoringError``, exit 2)."""
    hidden = task.get(HIDDEN) or {}
    if not isinstance(hidden, dict):
        raise ScoringError(f"the task's {HIDDEN!r} is not a JSON object")
    fail_to_pass = _test_list(hidden, "FAIL_TO_PASS")
    pass_to_pass = _test_list(hidden, "PASS_TO_PASS")
    if not fail_to_pass:
        raise ScoringError("the task lists no hidden.FAIL_TO_PASS tests")
    return fail_to_pass, pass_to_pass


def _test_list(hidden: dict[str, Any], name: str) -> list[str]:
    value = hidden.get(name)
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else None
        except ValueError:
            value = [value]  # one test id, written as a bare string
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(t, str) and t.strip() for t in value):
        raise ScoringError(
            f"hidden.{name} must be a list of test ids (or a JSON-encoded one), got {json.dumps(value)[:80]}"
        )
    return value


def summary(
    run: TestRun,
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    *,
    failed: Sequence[str] = (),
    flags: Sequence[str] = (),
) -> dict[str, Any]:
    """The scorer's JSON: reward 1.0 only if every listed test passed and no flag zeroes it.
    ``failed``/``flags``: more failures and flags from other signals (the coding tasks' probes)."""
    listed = fail_to_pass + pass_to_pass
    failing = set(failed)
    bad = [t for t in listed if not run.passed(t) or t in failing]
    all_flags = list(dict.fromkeys([*run.flags, *flags]))
    zeroing = [f for f in all_flags if f not in INFORMATIONAL]
    return {
        "reward": 0.0 if bad or zeroing else 1.0,
        "flags": all_flags,
        "fail_to_pass": f"{sum(t not in bad for t in fail_to_pass)}/{len(fail_to_pass)}",
        "pass_to_pass": f"{sum(t not in bad for t in pass_to_pass)}/{len(pass_to_pass)}",
        "failed": bad[:20],
        "missing": run.missing[:20],
        "timed_out": run.timed_out,
        "pytest_exit": run.exit_code,
        "isolation": run.isolation,
        "leftovers": run.leftovers,
        "output_tail": run.output[-1000:],
    }


def _install_of(python: str) -> tuple[Path, ...]:
    """The folder of an interpreter's install (``/opt/conda`` for ``/opt/conda/bin/python``), for the
    scored code's domain to read; none for one under the system folders, which it reads anyway."""
    real = Path(os.path.realpath(python))
    if real.parts[1:2] and real.parts[1] in ("usr", "bin", "lib", "lib64", "sbin"):
        return ()
    return (real.parent.parent,)


def score_tests(
    task: dict[str, Any],
    files: Path | None,
    workspace: Path,
    *,
    timeout_s: float = 60.0,
    config: str | None = None,
    python: str | None = None,
) -> dict[str, Any]:
    """Restore ``files`` (if given) over ``workspace``, run the task's listed tests; the JSON result."""
    fail_to_pass, pass_to_pass = test_lists(task)
    if files is not None:
        restored = set(restore_files(files, workspace))
        # A FAIL_TO_PASS test in a file the folder lacks ran from the workspace's copy, the policy's
        # to edit: `def test_x(): pass` there scored 1 without a fix.
        unrestored = sorted({t.split("::", 1)[0] for t in fail_to_pass} - restored)
        if unrestored:
            raise ScoringError(
                f"the test files folder {str(files)!r} lacks {', '.join(unrestored[:5])}, which holds "
                "FAIL_TO_PASS tests: the workspace's copy, the policy's to edit, would decide them"
            )
    run = run_pytest(
        workspace, fail_to_pass + pass_to_pass, timeout_s=timeout_s, config=config, python=python
    )
    return summary(run, fail_to_pass, pass_to_pass)


def read_task(task_file: Path | None) -> dict[str, Any]:
    """The task (hidden fields included) from ``task_file``, default ``$HARNESSRL_TASK_FILE``."""
    where = str(task_file) if task_file else "$HARNESSRL_TASK_FILE"
    try:
        path = task_file or Path(os.environ["HARNESSRL_TASK_FILE"])
        task = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, KeyError, ValueError) as exc:
        raise ScoringError(f"cannot read the task from {where}: {exc!r}") from exc
    if not isinstance(task, dict):
        raise ScoringError(f"the task in {where} is not a JSON object")
    return task


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -I -m harnessrl.tasks.pytest_scoring", description=__doc__.splitlines()[0]
    )
    parser.add_argument("task_file", type=Path, nargs="?", help="default: $HARNESSRL_TASK_FILE")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--hidden", type=Path, help="the task's hidden folder: its files/ are restored first")
    where.add_argument("--files", type=Path, help="a folder of test files restored over the workspace first")
    parser.add_argument("--config", help="pytest's ini file, relative to the workspace (restore it too)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds for the whole test run")
    parser.add_argument(
        "--python",
        help="the interpreter that runs pytest (a task image's, e.g. /usr/bin/python3); default: this one",
    )
    args = parser.parse_args(argv)
    try:
        task = read_task(args.task_file)
        files = args.hidden / "files" if args.hidden is not None else args.files
        result = score_tests(
            task, files, Path.cwd(), timeout_s=args.timeout, config=args.config, python=args.python
        )
        print(json.dumps(result))
    except HarnessRLError as exc:
        print(f"harnessrl: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
