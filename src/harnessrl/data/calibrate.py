"""``calibrate``: run the current policy k times per task and record how often it passes.

It uses the normal rollout machinery — ``local_stack`` (store, engine, gateway, sandbox bridge,
local runner) and the ``Controller`` — so a calibration rollout is launched, sandboxed, scored and
audited exactly like a training rollout. Each record becomes a task with ``to_task`` and reaches the
harness through the config's harness spec (``{prompt}``, ``{task[repo]}``...).

Resumable: a task whose record is already in OUT with a clean calibration of the same k and the same
forced sampling is skipped (matched by ``instance_id``: its record is IN's, only the calibration is
OUT's); every finished batch is appended to OUT at once (fsync), and at the end OUT is rewritten
with IN's records in IN's order. Lines of tasks no longer in IN, and stale ones (another k or
sampling), are dropped (and counted) by that final rewrite, never before: an interrupted run keeps
them. A last line cut short (killed mid-append) is left out and its task run again. A task with
infrastructure failures is written but not counted as done, so a re-run measures it again. Until
that final rewrite ``OUT.calibrating`` says OUT is unfinished (``unfinished_marker``), and ``select``
refuses it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.data.records import (
    Record,
    append_record,
    instance_id,
    read_appended_records,
    read_records,
    same_file,
    to_task,
    write_records,
)
from harnessrl.errors import ConfigError, HarnessRLError

if TYPE_CHECKING:  # the stack imports the gateway and engines: only when calibrating
    from harnessrl.controller.stack import RolloutConfig
    from harnessrl.schemas import SamplingOverrides

log = logging.getLogger(__name__)

PASS_THRESHOLD = 1.0  # reward >= 1 is a pass: SWE-style evaluators give 1 only if every test passes


def unfinished_marker(out_path: Path) -> Path:
    """``OUT.calibrating``: there while a calibration writes OUT and after one that did not finish
    (interrupted, timed out, crashed), removed once OUT is rewritten whole. OUT itself cannot say:
    it holds the tasks done so far, each a valid line, so ``select`` on an interrupted OUT chose
    from a subset of the tasks and reported nothing amiss; it refuses an OUT beside this file."""
    return out_path.with_name(out_path.name + ".calibrating")


def check_calibration_finished(path: Path) -> None:
    """``ConfigError`` if ``path`` is the OUT of a calibration still running or interrupted."""
    marker = unfinished_marker(path)
    if marker.exists():
        raise ConfigError(
            f"{path} is an unfinished calibration ({marker} exists: calibrate was interrupted, or is "
            "running): run the same calibrate command to finish it, or delete that file to use only "
            "the tasks done so far"
        )


class CalibrationTimeout(HarnessRLError):
    """A batch of rollouts was not done in time; what finished before it is in OUT."""


def _batch_timeout(config: RolloutConfig, rollouts: int) -> float:
    """Long enough for ``rollouts`` at ``controller.concurrency`` at a time, in waves, each rollout
    taking what ``harnessrl rollout`` waits for one (``rollout_time_limit``: every attempt's harness,
    evaluator and audit time limits, plus two minutes). It used to count the harness's only: an
    evaluator slower than the harness (a SWE task's test suite) ended a healthy batch as timed out."""
    from harnessrl.controller.stack import rollout_time_limit

    waves = math.ceil(rollouts / config.controller.concurrency)
    return waves * rollout_time_limit(config)


def _is_done(record: Record, k: int, sampling: dict[str, Any] | None) -> bool:
    """Calibrated cleanly with the same k and the same forced sampling (None: the harness's own),
    in counts ``summarize`` could have written. A damaged line of OUT (a hand edit, another tool's
    ``calibration``: no ``passes``, a count as text) was taken as done and carried into OUT, and the
    run ended in a traceback from the report, after every other task's rollouts: it is run again."""
    cal = record.get("calibration")
    return (
        isinstance(cal, dict)
        and cal.get("k") == k
        and cal.get("sampling") == sampling
        and not cal.get("infra_failures", 0)
        and _is_count(cal.get("passes"), k)
        and _is_count(cal.get("flagged", 0), k)
    )


def _is_count(value: Any, k: int) -> bool:
    """A count of rollouts out of ``k``: an integer from 0 to ``k`` (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= k


def _rollout_id(task_id: str, nonce: str, sample: int) -> str:
    """``cal-<task hash>-<run nonce>-<sample>``: unique per invocation, and the sample index last."""
    digest = hashlib.sha1(task_id.encode()).hexdigest()[:12]
    return f"cal-{digest}-{nonce}-{sample}"


def summarize(k: int, rollouts: list[Any], sampling: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``calibration`` field for one task from its k finished rollouts (store ``Rollout``s),
    with the sampling forced on them if any."""
    rewards = [float(r.reward or 0.0) for r in rollouts]
    outcomes = [r.outcome.value if r.outcome else r.status.value for r in rollouts]
    forced = {"sampling": sampling} if sampling is not None else {}
    return {
        **forced,
        "k": k,
        "passes": sum(reward >= PASS_THRESHOLD for reward in rewards),
        "rewards": rewards,
        "outcomes": outcomes,
        "infra_failures": sum(o in ("infra_failure", "failed", "cancelled") for o in outcomes),
        "flagged": sum(bool(r.flags) for r in rollouts),
        "rollout_ids": [r.rollout_id for r in rollouts],
    }


async def calibrate_file(
    config: RolloutConfig,
    in_path: Path,
    out_path: Path,
    *,
    k: int = 4,
    run_dir: Path,
    sampling: SamplingOverrides | None = None,
    progress: Callable[[str], None] = log.info,
    batch_timeout_s: float | None = None,
) -> dict[str, Any]:
    """Calibrate every record of ``in_path`` not yet done in ``out_path``; returns the report.

    ``sampling`` is forced on every call of every rollout, as the trainer forces its own on training
    rollouts (``metadata["sampling"]``): a pass rate measured at the temperature and token cap the
    run trains with is the one that says whether a group will have reward variance.
    ``batch_timeout_s``: how long a batch may take (default ``_batch_timeout``; a test's seam)."""
    from harnessrl.controller.harness import check_tasks
    from harnessrl.controller.presets import apply_preset
    from harnessrl.controller.stack import check_environments, local_stack
    from harnessrl.environments.stopping import in_thread_stoppably

    if k < 1:
        raise ConfigError("calibrate: --k must be >= 1")
    if same_file(in_path, out_path):  # OUT is rewritten as the run goes: IN would be lost
        raise ConfigError(f"calibrate: OUT is IN ({out_path}); write the calibrated records to another file")
    records = read_records(in_path)
    ids = [instance_id(r) for r in records]
    if any(not i for i in ids) or len(set(ids)) != len(ids):
        raise ConfigError(f"calibrate: {in_path}: every record needs a unique instance_id (run filter first)")
    # Every record's task now: a bad one (a "hidden" that is no object) is refused before any work.
    tasks = {i: to_task(r) for i, r in zip(ids, records, strict=True)}
    # And one the harness cannot start on (a field its templates name missing, a NUL byte): one error
    # naming it before anything is made, not k infrastructure failures of every attempt.
    harness = apply_preset(config.harness)
    try:
        await asyncio.to_thread(check_tasks, harness, tasks.items(), config.evaluator)
    except ConfigError as exc:
        raise ConfigError(f"calibrate: {in_path}: {exc}") from None
    forced = sampling.as_metadata() if sampling is not None else None
    # OUT's folder now: each finished task is appended to OUT, and a folder that did not exist failed
    # the first append, after every rollout of the task had run.
    out_path.parent.mkdir(parents=True, exist_ok=True)
    lines, torn = read_appended_records(out_path) if out_path.exists() else ([], False)
    if torn:  # appends would continue the fragment's line: OUT without it, every whole line kept
        log.warning("calibrate: %s: its last line was cut short (a run killed mid-write); left out", out_path)
        write_records(out_path, lines)
    previous: dict[str, Record] = {}  # per task: its last line in OUT that is done, else its last line
    for r in lines:
        i = instance_id(r)
        if _is_done(r, k, forced) or i not in previous or not _is_done(previous[i], k, forced):
            previous[i] = r
    # A done task keeps its calibration on IN's record as it is now (a fixed FAIL_TO_PASS stays fixed).
    done = {
        i: {**r, "calibration": previous[i]["calibration"]}
        for i, r in zip(ids, records, strict=True)
        if i in previous and _is_done(previous[i], k, forced)
    }
    not_in_input = len(previous.keys() - set(ids))
    todo = [r for r in records if instance_id(r) not in done]
    stale = len(previous.keys() - done.keys()) - not_in_input
    progress(
        f"calibrate: {len(records)} tasks, {len(done)} already done, {len(todo)} to run (k={k})"
        + (
            f"; {stale} tasks of OUT measured otherwise (k, sampling, infra failures) run again"
            if stale
            else ""
        )
        + (f"; {not_in_input} tasks of OUT not in IN will be dropped at the end" if not_in_input else "")
    )
    # OUT's other lines (another k or sampling, infra failures, tasks not in IN) stay until the end's
    # rewrite: a run interrupted before then (a mistyped --k, a subset IN, Ctrl-C) loses none of them.

    marker = unfinished_marker(out_path)
    marker.write_text(f"calibrate {in_path} -> {out_path}, k={k}: not finished\n")
    overrides = {"sampling": forced} if forced is not None else {}  # as the trainer sets it
    results: dict[str, Record] = {}
    if todo:
        nonce = secrets.token_hex(3)
        # Enough tasks per batch to keep every controller slot busy; each batch is written out
        # when it ends, so an interrupted run loses at most one batch.
        per_batch = max(1, math.ceil(config.controller.concurrency / k))
        # Each task's image (docs/environments.md): built and checked to run the harness before any
        # rollout, so a missing image is one clear error, not k infrastructure failures per task.
        # A stop (Ctrl-C, SIGTERM) kills the build: asyncio's shutdown would wait for it.
        # (A task set lacking the environment field altogether is refused; the tasks left to run may
        # all be host tasks of a mixed set whose image tasks are done: the field is looked for in all.)
        await in_thread_stoppably(
            lambda: check_environments(harness, [tasks[instance_id(r)] for r in todo], whole=tasks.values())
        )
        # A run of its own: the controller claims only this invocation's rollouts, never another run's
        # queued ones that the store holds (a --run-dir reused, a training config's shared store).
        run_id = f"calibrate-{nonce}"
        async with local_stack(config, run_dir, run_id=run_id) as stack:
            for start in range(0, len(todo), per_batch):
                batch = todo[start : start + per_batch]
                ids_by_task: dict[str, list[str]] = {}
                for record in batch:
                    task = tasks[instance_id(record)]
                    ids_by_task[task["task_id"]] = [
                        stack.create_rollout(
                            task,
                            rollout_id=_rollout_id(task["task_id"], nonce, i),
                            run_id=run_id,
                            task_id=task["task_id"],
                            metadata={"calibration_sample": i, **overrides},
                        ).rollout_id
                        for i in range(k)
                    ]
                all_ids = [rid for rids in ids_by_task.values() for rid in rids]
                limit = batch_timeout_s or _batch_timeout(config, len(all_ids))
                try:
                    finished = {
                        r.rollout_id: r for r in await stack.controller.run_until_done(all_ids, limit)
                    }
                except TimeoutError as exc:
                    raise CalibrationTimeout(
                        f"calibrate: the rollouts of {', '.join(ids_by_task)} were not done after {limit:.0f} s; "
                        f"{len(done) + len(results)} tasks are done in {out_path}: run the same command to "
                        "resume (the harness's rollout logs are in the run folder)"
                    ) from exc
                for record in batch:
                    rollouts = [finished[rid] for rid in ids_by_task[instance_id(record)]]
                    out = {**record, "calibration": summarize(k, rollouts, forced)}
                    append_record(out_path, out)
                    results[instance_id(record)] = out
                    cal = out["calibration"]
                    progress(f"calibrate: {instance_id(record)}: {cal['passes']}/{k} passed")

    # Rewrite OUT in input order (appends arrive batch by batch), IN's tasks only.
    merged = [results.get(i) or done[i] for i in ids]
    write_records(out_path, merged)
    marker.unlink(missing_ok=True)  # OUT is whole: every task of IN, in IN's order
    cals = [r["calibration"] for r in merged]
    return {
        "command": "calibrate",
        "input": len(records),
        "skipped_already_done": len(done),
        "dropped_not_in_input": not_in_input,
        "calibrated": len(results),
        "k": k,
        "rollouts": len(results) * k,
        "never_solved": sum(c["passes"] == 0 for c in cals),
        "mixed": sum(0 < c["passes"] < k for c in cals),
        "always_solved": sum(c["passes"] >= k for c in cals),
        "with_infra_failures": sum(bool(c.get("infra_failures")) for c in cals),
        "flagged_rollouts": sum(c.get("flagged", 0) for c in cals),
        "sampling": forced if forced is not None else "the harness's",
        "run_dir": str(run_dir),
    }
