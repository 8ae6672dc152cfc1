"""Scoring a rollout of a coding task: what ``python -I -m harnessrl.tasks.coding evaluate`` does.

The evaluator runs this in the scorer's sandbox over a copy of the workspace, with the task's hidden
folder (``--hidden``, copied in read-only) and the task file (``$HARNESSRL_TASK_FILE``, without the
gold fields). The policy may have edited, deleted or rigged any file of the workspace, and the code
under test is as hostile as the policy, so the scorer never imports it and trusts nothing it prints:

1. **Probes, judged here.** One child (``probes.run_probes``, in its own Landlock domain through
   ``run_scored``) imports ``solution.py`` and reports what each probed check's call returns; this
   process compares the values with those recorded from the gold solution (``scoring.json``). The
   child runs *before* the hidden tests are restored, and cannot open the hidden folder, so it never
   sees an expected value.
2. **pytest, cross-checked.** The hidden ``files/`` (full test module, ``pytest.ini``) are restored
   over the workspace and the listed tests run through ``pytest_scoring.run_pytest``: isolated,
   with tripwires, its report read after every process of it is dead.
3. **The verdict.** Reward 1.0 only if every ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` test passed under
   pytest, every probed one also returned its expected value, the two agree test by test, and no
   flag says the run was tampered with. A probed test where they disagree zeroes the reward with
   ``verdict_disagreement``: pytest reported a pass the value does not support (or the reverse).

A hidden folder the scored code could read (built under ``/tmp`` or inside the workspace and run
without the evaluator's sandbox, or no Landlock) scores 0 with ``scorer_inputs_exposed`` without
running anything. A broken task (no ``scoring.json``, no ``FAIL_TO_PASS``) raises
``HiddenTestsError``: the scorer exits 2, which the controller records as a flagged 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harnessrl.tasks.coding import probes as probing
from harnessrl.tasks.pytest_scoring import (
    DISAGREEMENT,
    ScoringError,
    TestRun,
    restore_files,
    run_pytest,
    summary,
    test_lists,
)
from harnessrl.tasks.scored_child import INPUTS_EXPOSED, inputs_exposed


class HiddenTestsError(ScoringError):
    """The task's hidden folder or test lists are missing or unusable: not the policy's fault."""


def run_tests(
    workspace: Path, test_ids: list[str], *, timeout_s: float = 60.0, isolated: bool = True
) -> TestRun:
    """The task's pytest run (``pytest.ini`` restored beside the tests), as the scorer runs it."""
    return run_pytest(workspace, test_ids, timeout_s=timeout_s, config="pytest.ini", isolated=isolated)


def evaluate_task(
    task: dict[str, Any], hidden: Path, workspace: Path, *, timeout_s: float = 60.0
) -> dict[str, Any]:
    """Probes, then the restored hidden tests, in ``workspace``; the scorer's JSON result."""
    try:
        fail_to_pass, pass_to_pass = test_lists(task)
        spec = probing.load(hidden)
    except (ScoringError, OSError, ValueError, KeyError, TypeError) as exc:
        raise HiddenTestsError(
            f"unusable hidden folder {str(hidden)!r} (rebuild the task set?): {exc}"
        ) from exc
    listed = set(fail_to_pass + pass_to_pass)
    recorded = [p for p in spec.recorded() if p.test_id in listed]
    exposed = inputs_exposed([hidden], cwd=workspace)
    if exposed:
        return {
            "reward": 0.0,
            "flags": [INPUTS_EXPOSED],
            "why": f"the code under test could read {exposed}: its expected values would be no secret",
        }
    probe_run = probing.run_probes(workspace, recorded, spec, timeout_s=timeout_s)
    values = probing.verdicts(probe_run, recorded)
    restore_files(hidden / "files", workspace)
    run = run_tests(workspace, fail_to_pass + pass_to_pass, timeout_s=timeout_s)
    disagree = [t for t, ok in values.items() if ok != run.passed(t) and not run.timed_out]
    result = summary(
        run,
        fail_to_pass,
        pass_to_pass,
        failed=[t for t, ok in values.items() if not ok],
        flags=[DISAGREEMENT] if disagree else [],
    )
    result["probes"] = {
        "checked": len(values),
        "passed": sum(values.values()),
        "disagree": disagree[:20],
        "timed_out": probe_run.timed_out,
    }
    result["leftovers"] += probe_run.leftovers
    return result
