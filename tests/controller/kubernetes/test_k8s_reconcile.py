"""Pure reconcile tests: parsing, the failure-reason table, the concurrency cap, restart idempotence."""

from __future__ import annotations

from typing import Any

import pytest

from harnessrl.controller.base import Exit, ExitKind
from harnessrl.controller.kubernetes.observed import (
    ObservedJob,
    attach_pods,
    parse_job,
    parse_pod,
    parse_time,
)
from harnessrl.controller.kubernetes.reconcile import DesiredAttempt, classify, plan

NOW = parse_time("2025-01-01T00:10:00Z")
assert NOW is not None
T0 = "2025-01-01T00:00:00Z"  # ten minutes before NOW
T_RECENT = "2025-01-01T00:09:30Z"  # thirty seconds before NOW


def job_json(
    name: str, *, status: dict[str, Any] | None = None, created: str = T0, **meta: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "creationTimestamp": created, "uid": f"uid-{name}", **meta},
        "status": {"startTime": created, "active": 1, **(status or {})},
    }


def failed(reason: str, message: str = "") -> dict[str, Any]:
    return {
        "active": 0,
        "failed": 1,
        "conditions": [
            {
                "type": "Failed",
                "status": "True",
                "reason": reason,
                "message": message,
                "lastTransitionTime": T0,
            }
        ],
    }


SUCCEEDED = {"active": 0, "succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}


def pod_json(
    job: str,
    *,
    phase: str = "Running",
    reason: str = "",
    containers: list[dict[str, Any]] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{job}-abcde",
            "creationTimestamp": T0,
            "labels": {"job-name": job},
            "annotations": {"harnessrl/harness-container": "harness"},
        },
        "status": {
            "phase": phase,
            "reason": reason,
            "conditions": conditions or [],
            "containerStatuses": containers or [],
            "initContainerStatuses": init or [],
        },
    }


def terminated(
    exit_code: int, reason: str = "Error", name: str = "harness", started: bool = True
) -> dict[str, Any]:
    state = {"exitCode": exit_code, "reason": reason, **({"startedAt": T0} if started else {})}
    return {"name": name, "state": {"terminated": state}}


def waiting(reason: str, name: str = "harness") -> dict[str, Any]:
    return {"name": name, "state": {"waiting": {"reason": reason, "message": "details"}}}


def observe(job: dict[str, Any], *pods: dict[str, Any]) -> ObservedJob:
    return parse_job(job, [parse_pod(p) for p in pods])


def kind_of(job: ObservedJob, stuck_pending_s: float = 300.0) -> tuple[ExitKind, int | None] | None:
    exit_ = classify(job, now=NOW, stuck_pending_s=stuck_pending_s)
    return None if exit_ is None else (exit_.kind, exit_.exit_code)


# --- the failure mapping table (docs/kubernetes.md) ------------------------------------------------
CASES = [
    ("succeeded", observe(job_json("j", status=SUCCEEDED)), (ExitKind.EXITED, 0)),
    (
        "running",
        observe(job_json("j"), pod_json("j", containers=[{"name": "harness", "state": {"running": {}}}])),
        None,
    ),
    (
        "exit code",
        observe(
            job_json("j", status=failed("BackoffLimitExceeded")),
            pod_json("j", phase="Failed", containers=[terminated(3)]),
        ),
        (ExitKind.EXITED, 3),
    ),
    (
        "oom",
        observe(
            job_json("j", status=failed("BackoffLimitExceeded")),
            pod_json("j", phase="Failed", containers=[terminated(137, "OOMKilled")]),
        ),
        (ExitKind.OOM, 137),
    ),
    (
        "deadline, pods gone",
        observe(job_json("j", status=failed("DeadlineExceeded"))),
        (ExitKind.TIMEOUT, None),
    ),
    (
        "deadline while running",
        observe(
            job_json("j", status=failed("DeadlineExceeded")),
            pod_json("j", containers=[{"name": "harness", "state": {"running": {}}}]),
        ),
        (ExitKind.TIMEOUT, None),
    ),
    (
        "deadline before start",
        observe(
            job_json("j", status=failed("DeadlineExceeded")),
            pod_json("j", phase="Pending", containers=[waiting("ImagePullBackOff")]),
        ),
        (ExitKind.INFRA, None),
    ),
    (
        "evicted",
        observe(
            job_json("j", status=failed("BackoffLimitExceeded")),
            pod_json("j", phase="Failed", reason="Evicted", containers=[terminated(137)]),
        ),
        (ExitKind.INFRA, None),
    ),
    (
        "node lost",
        observe(job_json("j"), pod_json("j", phase="Failed", reason="NodeLost")),
        (ExitKind.INFRA, None),
    ),
    (
        "disruption",
        observe(
            job_json("j", status=failed("PodFailurePolicy")),
            pod_json(
                "j",
                phase="Failed",
                containers=[terminated(143)],
                conditions=[
                    {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
                ],
            ),
        ),
        (ExitKind.INFRA, None),
    ),
    ("pod failure policy", observe(job_json("j", status=failed("PodFailurePolicy"))), (ExitKind.INFRA, None)),
    (
        "invalid image at once",
        observe(
            job_json("j", created=T_RECENT),
            pod_json("j", phase="Pending", containers=[waiting("InvalidImageName")]),
        ),
        (ExitKind.INFRA, None),
    ),
    (
        "image pull, stuck",
        observe(job_json("j"), pod_json("j", phase="Pending", containers=[waiting("ErrImagePull")])),
        (ExitKind.INFRA, None),
    ),
    (
        "image pull, recent",
        observe(
            job_json("j", created=T_RECENT),
            pod_json("j", phase="Pending", containers=[waiting("ImagePullBackOff")]),
        ),
        None,
    ),
    (
        "unschedulable, stuck",
        observe(
            job_json("j"),
            pod_json(
                "j",
                phase="Pending",
                conditions=[
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "lastTransitionTime": T0,
                    }
                ],
            ),
        ),
        (ExitKind.INFRA, None),
    ),
    (
        "unschedulable, recent",
        observe(
            job_json("j"),
            pod_json(
                "j",
                phase="Pending",
                conditions=[
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "lastTransitionTime": T_RECENT,
                    }
                ],
            ),
        ),
        None,
    ),
    (
        "start error",
        observe(
            job_json("j", status=failed("BackoffLimitExceeded")),
            pod_json("j", phase="Failed", containers=[terminated(128, "StartError")]),
        ),
        (ExitKind.INFRA, None),
    ),
    (
        "init container failed",
        observe(
            job_json("j", status=failed("BackoffLimitExceeded")),
            pod_json(
                "j",
                phase="Failed",
                init=[terminated(1, name="setup")],
                containers=[waiting("PodInitializing")],
            ),
        ),
        (ExitKind.INFRA, None),
    ),
    (
        "failed, no pods left",
        observe(job_json("j", status=failed("BackoffLimitExceeded"))),
        (ExitKind.INFRA, None),
    ),
    ("no pod for long", observe(job_json("j", status={"active": 0})), (ExitKind.INFRA, None)),
    (
        "sidecar exit is not the harness",
        observe(
            job_json("j", status=failed("BackoffLimitExceeded")),
            pod_json("j", phase="Failed", containers=[terminated(9, name="logger"), terminated(4)]),
        ),
        (ExitKind.EXITED, 4),
    ),
]


@pytest.mark.parametrize(("case", "job", "expected"), CASES, ids=[c[0] for c in CASES])
def test_failure_mapping(case: str, job: ObservedJob, expected: tuple[ExitKind, int | None] | None) -> None:
    assert kind_of(job) == expected


def test_parse_job_and_pod_fields() -> None:
    job = parse_job(
        job_json("j", status=failed("DeadlineExceeded", "too long"), deletionTimestamp=T0, labels={"a": "b"})
    )
    assert (job.name, job.uid, job.active, job.failed, job.deleting) == ("j", "uid-j", 0, 1, True)
    assert job.finished and not job.complete and job.failed_condition.reason == "DeadlineExceeded"
    assert job.created_at == parse_time(T0) and job.labels == {"a": "b"}
    pod = parse_pod(pod_json("j", containers=[terminated(2)]))
    assert pod.job_name == "j" and pod.harness().exit_code == 2 and pod.harness().started
    attached = attach_pods({"j": job, "k": parse_job(job_json("k"))}, [pod])
    assert attached["j"].pods == (pod,) and attached["k"].pods == ()


def desired(n: int, **kwargs: Any) -> list[DesiredAttempt]:
    return [DesiredAttempt(f"job-{i}", f"r{i}", 0, **kwargs) for i in range(n)]


def running(name: str) -> ObservedJob:
    return parse_job(job_json(name, created=T_RECENT))


def test_cap_respected_and_fifo() -> None:
    p = plan(desired(5), {}, max_concurrent=2, now=NOW)
    assert [d.name for d in p.create] == ["job-0", "job-1"]
    assert p.waiting == ["job-2", "job-3", "job-4"]


def test_cap_counts_running_orphans_and_unlisted_creations() -> None:
    want = [DesiredAttempt("job-0", "r0", 0, created=True), *desired(3)[1:]]
    observed = {"orphan": running("orphan")}
    # job-0 was created but the (stale) snapshot does not show it yet: it still holds a slot
    p = plan(want, observed, max_concurrent=3, now=NOW, delete_orphans=False)
    assert [d.name for d in p.create] == ["job-1"] and p.waiting == ["job-2"]
    assert p.delete == []


def test_finished_jobs_free_their_slot() -> None:
    want = desired(3)
    observed = {"job-0": parse_job(job_json("job-0", status=SUCCEEDED))}
    p = plan(want, observed, max_concurrent=1, now=NOW)
    assert p.completed == {"job-0": Exit(ExitKind.EXITED, 0, "job succeeded")}
    assert [d.name for d in p.create] == ["job-1"]
    assert p.adopted == ["job-0"]


def test_idempotent_after_restart() -> None:
    """A second planning pass (a restarted controller: nothing marked created) that observes the Jobs
    the first pass created plans no creates and adopts them instead."""
    want = desired(3)
    first = plan(want, {}, max_concurrent=10, now=NOW)
    assert len(first.create) == 3
    observed = {d.name: running(d.name) for d in first.create}
    second = plan(desired(3), observed, max_concurrent=10, now=NOW)
    assert second.create == [] and second.delete == [] and second.completed == {}
    assert sorted(second.adopted) == ["job-0", "job-1", "job-2"]


def test_orphans_deleted_only_when_allowed_and_unfinished() -> None:
    observed = {
        "orphan": running("orphan"),
        "done": parse_job(job_json("done", status=SUCCEEDED)),
        "going": parse_job(job_json("going", deletionTimestamp=T0)),
    }
    assert plan([], observed, max_concurrent=5, now=NOW, delete_orphans=False).delete == []
    assert plan([], observed, max_concurrent=5, now=NOW).delete == ["orphan"]  # finished: left to TTL


def test_stuck_attempt_completed_and_deleted() -> None:
    observed = {
        "job-0": observe(
            job_json("job-0"), pod_json("job-0", phase="Pending", containers=[waiting("ImagePullBackOff")])
        )
    }
    want = [DesiredAttempt("job-0", "r0", 0, created=True)]
    p = plan(want, observed, max_concurrent=1, now=NOW, stuck_pending_s=60)
    assert p.completed["job-0"].kind is ExitKind.INFRA and p.delete == ["job-0"]


def test_vanished_job_is_infra() -> None:
    want = [DesiredAttempt("job-0", "r0", 0, created=True, vanished=True)]
    p = plan(want, {}, max_concurrent=1, now=NOW)
    assert p.completed["job-0"].kind is ExitKind.INFRA and p.create == []


def test_orphan_secrets_swept_after_grace() -> None:
    now = NOW
    secrets = {"job-0": now - 1000, "old": now - 1000, "young": now - 5, "has-job": now - 1000}
    observed = {"has-job": parse_job(job_json("has-job", status=SUCCEEDED))}
    p = plan(
        desired(1), observed, max_concurrent=1, now=now, observed_secrets=secrets, orphan_secret_grace_s=60
    )
    assert p.delete_secrets == ["old"]
    assert (
        plan(
            desired(1), observed, max_concurrent=1, now=now, observed_secrets=secrets, delete_orphans=False
        ).delete_secrets
        == []
    )
