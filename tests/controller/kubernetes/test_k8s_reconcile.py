"""Pure reconcile tests: parsing, the failure-reason table, the concurrency cap, restart idempotence."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from harnessrl.controller.base import Exit, ExitKind
from harnessrl.controller.kubernetes.names import attempt_labels
from harnessrl.controller.kubernetes.observed import (
    ObservedJob,
    ObservedSecret,
    attach_pods,
    parse_job,
    parse_pod,
    parse_quantity,
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


def unschedulable(since: str) -> dict[str, Any]:
    """A pending pod of Job ``j`` the scheduler has found no node for since ``since``."""
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "lastTransitionTime": since,
    }
    return pod_json("j", phase="Pending", conditions=[condition])


def observe(job: dict[str, Any], *pods: dict[str, Any]) -> ObservedJob:
    return parse_job(job, [parse_pod(p) for p in pods])


def kind_of(
    job: ObservedJob, stuck_pending_s: float = 300.0, **seen: Any
) -> tuple[ExitKind, int | None] | None:
    exit_ = classify(job, now=NOW, stuck_pending_s=stuck_pending_s, **seen)
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
    (  # no pod was ever seen running: no harness ran out of its time (the runner's record says
        # when one was, see test_deadline_is_a_timeout_only_for_a_harness_that_had_its_time)
        "deadline, pods gone",
        observe(job_json("j", status=failed("DeadlineExceeded"))),
        (ExitKind.INFRA, None),
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
        observe(job_json("j"), unschedulable(T0)),
        (ExitKind.INFRA, None),
    ),
    (
        "unschedulable, recent",
        observe(job_json("j"), unschedulable(T_RECENT)),
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


def ids(rollout: str, attempt: int, controller: str | None) -> dict[str, Any]:
    """The labels and annotations the runner puts on an attempt's Job and Secret."""
    return {
        "labels": attempt_labels("run-1", rollout, attempt, controller=controller),
        "annotations": {"harnessrl/rollout-id": rollout, "harnessrl/attempt": str(attempt)},
    }


def test_orphans_are_only_this_runners_own_or_superseded_attempts() -> None:
    """Controllers sharing a run see each other's Jobs: only this runner's own unwanted Jobs and
    Jobs of attempts a later attempt launched here supersedes are deleted (bug: every unfinished Job
    this runner had not launched was deleted, so two controllers killed each other's rollouts)."""
    observed = {
        "mine": parse_job(job_json("mine", created=T_RECENT, **ids("r-mine", 0, "me"))),
        "theirs": parse_job(job_json("theirs", created=T_RECENT, **ids("r-theirs", 0, "other"))),
        "legacy": parse_job(job_json("legacy", created=T_RECENT, **ids("r-legacy", 0, None))),
        "old": parse_job(job_json("old", created=T_RECENT, **ids("r1", 0, "other"))),
        "done": parse_job(job_json("done", status=SUCCEEDED, **ids("r-done", 0, "me"))),
        "going": parse_job(job_json("going", deletionTimestamp=T0, **ids("r-going", 0, "me"))),
    }
    want = [DesiredAttempt("r1-a1", "r1", 1)]  # attempt 1 of r1 supersedes attempt 0 ("old")
    p = plan(want, observed, max_concurrent=10, now=NOW, owner="me")
    assert sorted(p.delete) == ["mine", "old"]  # finished: left to the TTL; going: already going
    assert plan(want, observed, max_concurrent=10, now=NOW, owner="me", delete_orphans=False).delete == []
    assert plan([], observed, max_concurrent=10, now=NOW, owner="someone-else").delete == []


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

    def secret(
        rollout: str, attempt: int = 0, controller: str | None = "me", age: float = 1000
    ) -> ObservedSecret:
        return ObservedSecret(rollout, created_at=now - age, **ids(rollout, attempt, controller))

    secrets = {
        "job-0": secret("job-0"),  # its attempt is wanted
        "old": secret("old"),
        "young": secret("young", age=5),
        "has-job": secret("has-job"),  # the garbage collector removes it with its Job
        "theirs": secret("theirs", controller="other"),  # another controller's, no Job: swept too
        "theirs-young": secret("theirs-young", controller="other", age=5),  # maybe its Job is coming
        "r0": secret("r0", attempt=1, controller="other"),  # superseded by attempt 2 below
    }
    want = [DesiredAttempt("job-0", "r0", 2)]
    observed = {"has-job": parse_job(job_json("has-job", status=SUCCEEDED))}
    p = plan(
        want,
        observed,
        max_concurrent=1,
        now=now,
        observed_secrets=secrets,
        orphan_secret_grace_s=60,
        owner="me",
    )
    assert sorted(p.delete_secrets) == ["old", "r0", "theirs"]
    assert (
        plan(
            want,
            observed,
            max_concurrent=1,
            now=now,
            observed_secrets=secrets,
            delete_orphans=False,
            owner="me",
        ).delete_secrets
        == []
    )


def test_a_dead_controllers_secret_with_no_job_is_swept() -> None:
    """Bug: a Secret (rollout key, task, harness files) whose controller died before creating its
    Job, or whose owner reference was never set, carries that controller's id: no other runner
    ever swept it, though the docs said orphan Secrets are swept once orphan_grace_s old."""
    dead = ObservedSecret("dead", created_at=NOW - 1000, **ids("r-dead", 0, "gone"))
    p = plan([], {}, max_concurrent=1, now=NOW, observed_secrets={"dead": dead}, owner="me")
    assert p.delete_secrets == ["dead"]


def test_a_peers_secret_rewritten_within_the_grace_is_kept() -> None:
    """A live controller retrying its Job create (quota full) rewrites its Secret on every try; the
    Secret keeps its old creationTimestamp, so the sweep counts from the runner's written-at stamp."""
    meta = ids("r-busy", 0, "peer")
    meta["annotations"]["harnessrl/written-at"] = f"{NOW - 5:.3f}"
    busy = ObservedSecret("busy", created_at=NOW - 1000, **meta)
    assert busy.written_at == NOW - 5
    p = plan([], {}, max_concurrent=1, now=NOW, observed_secrets={"busy": busy}, orphan_secret_grace_s=60)
    assert p.delete_secrets == []
    later = plan(
        [], {}, max_concurrent=1, now=NOW + 60, observed_secrets={"busy": busy}, orphan_secret_grace_s=60
    )
    assert later.delete_secrets == ["busy"]  # that controller stopped trying: swept


# --- native sidecars -------------------------------------------------------------------------------
def test_a_native_sidecar_stopped_after_the_harness_is_not_an_init_failure() -> None:
    """Bug: every init container that ended non-zero made the attempt INFRA, including native
    sidecars (restartPolicy: Always, e.g. Istio's proxy), which are SIGTERMed (143) once the harness
    exits: a harness that exited 1 was retried and left out of the baseline."""
    pod = pod_json(
        "j",
        phase="Failed",
        containers=[terminated(1)],
        init=[terminated(0, name="harnessrl-seed-workspace"), terminated(143, name="istio-proxy")],
    )
    pod["spec"] = {
        "initContainers": [
            {"name": "harnessrl-seed-workspace"},
            {"name": "istio-proxy", "restartPolicy": "Always"},
        ],
        "containers": [{"name": "harness"}],
    }
    job = observe(job_json("j", status=failed("BackoffLimitExceeded")), pod)
    assert kind_of(job) == (ExitKind.EXITED, 1)
    # an ordinary init container that failed is still the setup's failure
    pod["spec"]["initContainers"][1].pop("restartPolicy")
    assert kind_of(observe(job_json("j", status=failed("BackoffLimitExceeded")), pod)) == (
        ExitKind.INFRA,
        None,
    )


# --- evictions: the agent's own overrun is the policy's; the node's trouble is infrastructure -------
def evicted_pod(message: str, *, limits: dict[str, str], as_condition: bool = False, started: bool = True):
    harness = terminated(137) if started else waiting("PodInitializing")
    pod = pod_json(
        "j",
        phase="Running" if as_condition else "Failed",
        reason="" if as_condition else "Evicted",
        containers=[harness, terminated(0, name="logger")],
        conditions=[
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "TerminationByKubelet",
                "message": message,
            }
        ]
        if as_condition
        else [],
    )
    pod["status"]["message"] = "" if as_condition else message
    pod["spec"] = {
        "containers": [
            {"name": "logger", "resources": {"limits": {"ephemeral-storage": "100Mi"}}},
            {"name": "harness", "resources": {"limits": limits}},
        ]
    }
    return pod


STORAGE = {"ephemeral-storage": "10Gi", "memory": "2Gi"}
EVICTIONS = [
    ('Container harness exceeded its local ephemeral storage limit "10Gi". ', ExitKind.RESOURCE_LIMIT),
    (
        "Pod ephemeral local storage usage exceeds the total limit of containers 10Gi. ",
        ExitKind.RESOURCE_LIMIT,
    ),
    ('Usage of EmptyDir volume "harnessrl-workspace" exceeds the limit "10Gi". ', ExitKind.RESOURCE_LIMIT),
    (
        "The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 5Gi. "
        "Container harness was using 80Gi, which exceeds its request of 0. ",
        ExitKind.RESOURCE_LIMIT,
    ),
    (  # within its own limit on an overcommitted node: not the agent's doing
        "The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 5Gi. "
        "Container harness was using 2Gi, which exceeds its request of 0. ",
        ExitKind.INFRA,
    ),
    (
        "The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 5Gi. "
        "Container logger was using 80Gi, which exceeds its request of 0. ",
        ExitKind.INFRA,
    ),
    ('Container logger exceeded its local ephemeral storage limit "100Mi". ', ExitKind.INFRA),
    (
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. "
        "Container harness was using 1500Mi, which exceeds its request of 1Gi. ",
        ExitKind.INFRA,
    ),
    ("The node was low on resource: memory. ", ExitKind.INFRA),
    ("Pod was rejected: Predicate NodeAffinity failed", ExitKind.INFRA),
]


@pytest.mark.parametrize("as_condition", [False, True], ids=["pod-status", "disruption-condition"])
@pytest.mark.parametrize(("message", "kind"), EVICTIONS, ids=[f"eviction-{i}" for i in range(len(EVICTIONS))])
def test_evictions_for_the_pods_own_usage_are_the_policys(
    message: str, kind: ExitKind, as_condition: bool
) -> None:
    """Bug: every eviction was INFRA, so an agent that filled its disk got its 0 retried and left
    out of the baseline."""
    job = observe(
        job_json("j", status=failed("BackoffLimitExceeded")),
        evicted_pod(message, limits=STORAGE, as_condition=as_condition),
    )
    assert kind_of(job) == (kind, None)


def test_a_node_pressure_eviction_blames_no_harness_without_a_limit() -> None:
    message = (
        "The node was low on resource: ephemeral-storage. "
        "Container harness was using 80Gi, which exceeds its request of 0. "
    )
    job = observe(job_json("j", status=failed("BackoffLimitExceeded")), evicted_pod(message, limits={}))
    assert kind_of(job) == (ExitKind.INFRA, None)


def test_an_overrun_before_the_harness_ran_is_infrastructure() -> None:
    """The seed copy of the image's workspace overran the volume: no policy had run yet."""
    message = 'Usage of EmptyDir volume "harnessrl-workspace" exceeds the limit "10Gi". '
    pod = evicted_pod(message, limits=STORAGE, started=False)
    job = observe(job_json("j", status=failed("BackoffLimitExceeded")), pod)
    assert kind_of(job) == (ExitKind.INFRA, None)
    assert kind_of(job, harness_started_at=NOW - 60) == (
        ExitKind.RESOURCE_LIMIT,
        None,
    )  # the runner saw it run


@pytest.mark.parametrize("as_condition", [False, True], ids=["pod-status", "disruption-condition"])
@pytest.mark.parametrize("resource", ["inodes", "pids"])
def test_inode_and_pid_pressure_after_the_harness_ran_is_the_policys(
    resource: str, as_condition: bool
) -> None:
    """Bug: an eviction for node inode or PID pressure was INFRA, so a failing agent could turn its
    0 into a retry (left out of the baseline) with millions of files or a fork bomb. The kubelet
    names no container for these (pkg/kubelet/eviction/helpers.go) and a pod has no limit of them."""
    message = f"The node was low on resource: {resource}. Threshold quantity: 1000, available: 10. "
    ran = evicted_pod(message, limits=STORAGE, as_condition=as_condition)
    assert kind_of(observe(job_json("j", status=failed("BackoffLimitExceeded")), ran)) == (
        ExitKind.RESOURCE_LIMIT,
        None,
    )
    # before the harness started no policy had run: the node's trouble, retried
    not_yet = evicted_pod(message, limits=STORAGE, as_condition=as_condition, started=False)
    assert kind_of(observe(job_json("j", status=failed("BackoffLimitExceeded")), not_yet)) == (
        ExitKind.INFRA,
        None,
    )


def test_parse_quantity() -> None:
    assert parse_quantity("10Gi") == 10 * 1024**3 and parse_quantity("80G") == 80e9
    assert parse_quantity("500m") == 0.5 and parse_quantity("1e3") == 1000 and parse_quantity("2") == 2
    assert parse_quantity("1E") == 1e18 and parse_quantity(3) == 3.0
    assert parse_quantity("ten") is None and parse_quantity("") is None and parse_quantity(None) is None


# --- the deadline: only a harness that ran for its whole time timed out ------------------------------
START = parse_time(T0)
assert START is not None


def deadline_job(*pods: dict[str, Any]) -> ObservedJob:
    """A Job that started at T0 with the runner's deadline (timeout 120 s + 60 s allowance), failed."""
    raw = job_json("j", status=failed("DeadlineExceeded"))
    raw["spec"] = {"activeDeadlineSeconds": 180}
    return observe(raw, *pods)


def running_since(at: float) -> dict[str, Any]:
    started = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"name": "harness", "state": {"running": {"startedAt": started}}}


def test_deadline_is_a_timeout_only_for_a_harness_that_had_its_time() -> None:
    """Bug: DeadlineExceeded with no pod left was TIMEOUT though no harness had ever run (a Job with
    no pod for 180 s fails at its deadline before the 300 s "no pod created" rule fires)."""
    gone = deadline_job()
    assert kind_of(gone, timeout_s=120) == (ExitKind.INFRA, None)  # never seen running
    assert kind_of(gone, timeout_s=120, harness_started_at=START + 10) == (ExitKind.TIMEOUT, None)
    assert kind_of(gone, harness_started_at=START + 10) == (ExitKind.TIMEOUT, None)  # its time unknown
    # A pull that took 100 s of a 60 s allowance: the deadline cut the harness's 120 s to 80.
    assert kind_of(gone, timeout_s=120, harness_started_at=START + 100) == (ExitKind.INFRA, None)
    late = deadline_job(pod_json("j", containers=[running_since(START + 100)]))
    assert kind_of(late, timeout_s=120) == (ExitKind.INFRA, None)
    on_time = deadline_job(pod_json("j", containers=[running_since(START + 30)]))
    assert kind_of(on_time, timeout_s=120) == (ExitKind.TIMEOUT, None)
    pulling = deadline_job(pod_json("j", phase="Pending", containers=[waiting("ContainerCreating")]))
    assert kind_of(pulling, timeout_s=120) == (ExitKind.INFRA, None)
