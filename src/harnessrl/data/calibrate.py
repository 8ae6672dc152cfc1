"""``calibrate``: run the current policy k times per task and record how often it passes.

It uses the normal rollout machinery — ``local_stack`` (store, engine, gateway, sandbox bridge,
local runner) and the ``Controller`` — so a calibration rollout is launched, sandboxed, scored and
audited exactly like a training rollout. Each record becomes a task with ``to_task`` and reaches the
harness through the config's harness spec (``{prompt}``, ``{task[repo]}``...).

Resumable: a task whose record is already in OUT with a clean calibration of the same k and the same
forced sampling is skipped; every finished task is appended to OUT at once (fsync), and at the end
OUT is rewritten in input order. A task with infrastructure failures is written but not counted as
done, so a re-run measures it again.
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

from harnessrl.data.records import Record, append_record, instance_id, read_records, to_task, write_records
from harnessrl.errors import ConfigError

if TYPE_CHECKING:  # the stack imports the gateway and engines: only when calibrating
    from harnessrl.controller.stack import RolloutConfig
    from harnessrl.schemas import SamplingOverrides

log = logging.getLogger(__name__)

PASS_THRESHOLD = 1.0  # reward >= 1 is a pass: SWE-style evaluators give 1 only if every test passes


def _is_done(record: Record, k: int, sampling: dict[str, Any] | None) -> bool:
    """Calibrated cleanly with the same k and the same forced sampling (None: the harness's own)."""
    cal = record.get("calibration")
    return (
        isinstance(cal, dict)
        and cal.get("k") == k
        and cal.get("sampling") == sampling
        and not cal.get("infra_failures", 0)
    )


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
) -> dict[str, Any]:
    """Calibrate every record of ``in_path`` not yet done in ``out_path``; returns the report.

    ``sampling`` is forced on every call of every rollout, as the trainer forces its own on training
    rollouts (``metadata["sampling"]``): a pass rate measured at the temperature and token cap the
    run trains with is the one that says whether a group will have reward variance."""
    from harnessrl.controller.presets import apply_preset
    from harnessrl.controller.stack import check_environments, local_stack

    if k < 1:
        raise ConfigError("calibrate: --k must be >= 1")
    records = read_records(in_path)
    ids = [instance_id(r) for r in records]
    if any(not i for i in ids) or len(set(ids)) != len(ids):
        raise ConfigError(f"calibrate: {in_path}: every record needs a unique instance_id (run filter first)")
    forced = sampling.as_metadata() if sampling is not None else None
    previous = {instance_id(r): r for r in read_records(out_path)} if out_path.exists() else {}
    done = {i: r for i, r in previous.items() if _is_done(r, k, forced)}
    todo = [r for r in records if instance_id(r) not in done]
    progress(f"calibrate: {len(records)} tasks, {len(done)} already done, {len(todo)} to run (k={k})")
    if previous.keys() - done.keys():  # drop stale lines (other k or sampling, infra failures)
        write_records(out_path, done.values())

    overrides = {"sampling": forced} if forced is not None else {}  # as the trainer sets it
    results: dict[str, Record] = {}
    if todo:
        nonce = secrets.token_hex(3)
        # Enough tasks per batch to keep every controller slot busy; each batch is written out
        # when it ends, so an interrupted run loses at most one batch.
        per_batch = max(1, math.ceil(config.controller.concurrency / k))
        limit = config.harness.timeout_s * (config.controller.max_infra_retries + 1) + 120
        # Each task's image (docs/environments.md): built and checked to run the harness before any
        # rollout, so a missing image is one clear error, not k infrastructure failures per task.
        harness = apply_preset(config.harness)
        await asyncio.to_thread(check_environments, harness, [to_task(r) for r in todo])
        async with local_stack(config, run_dir) as stack:
            for start in range(0, len(todo), per_batch):
                batch = todo[start : start + per_batch]
                ids_by_task: dict[str, list[str]] = {}
                for record in batch:
                    task = to_task(record)
                    ids_by_task[task["task_id"]] = [
                        stack.create_rollout(
                            task,
                            rollout_id=_rollout_id(task["task_id"], nonce, i),
                            task_id=task["task_id"],
                            metadata={"calibration_sample": i, **overrides},
                        ).rollout_id
                        for i in range(k)
                    ]
                all_ids = [rid for rids in ids_by_task.values() for rid in rids]
                finished = {r.rollout_id: r for r in await stack.controller.run_until_done(all_ids, limit)}
                for record in batch:
                    rollouts = [finished[rid] for rid in ids_by_task[instance_id(record)]]
                    out = {**record, "calibration": summarize(k, rollouts, forced)}
                    append_record(out_path, out)
                    results[instance_id(record)] = out
                    cal = out["calibration"]
                    progress(f"calibrate: {instance_id(record)}: {cal['passes']}/{k} passed")

    # Rewrite OUT in input order (appends arrive batch by batch); lines for tasks no longer in IN
    # are kept at the end rather than silently lost.
    merged = [results.get(i) or done[i] for i in ids]
    wanted = set(ids)
    extra = [r for i, r in done.items() if i not in wanted]
    write_records(out_path, merged + extra)
    cals = [r["calibration"] for r in merged]
    return {
        "command": "calibrate",
        "input": len(records),
        "skipped_already_done": len(done),
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
