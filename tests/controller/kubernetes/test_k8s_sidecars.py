"""A regular sidecar container of the template (a log shipper, a proxy) keeps the pod, and so the
Job, running after the harness exits: the harness's own exit must be the outcome, not the TIMEOUT
that the Job's deadline would report much later."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from tests.controller.kubernetes.k8s_support import until

from harnessrl.controller.base import ExitKind
from harnessrl.controller.kubernetes import KubernetesRunner
from harnessrl.controller.kubernetes.observed import parse_job, parse_pod, parse_time
from harnessrl.controller.kubernetes.reconcile import classify

pytestmark = pytest.mark.anyio

TEMPLATE = {
    "spec": {
        "containers": [
            {"name": "harness", "image": "ghcr.io/acme/agent:1"},
            {"name": "log-shipper", "image": "fluent/fluent-bit:3"},
        ]
    }
}


@pytest.fixture
def runner(make_runner: Callable[..., KubernetesRunner]) -> KubernetesRunner:
    return make_runner(namespace="default", job_template=TEMPLATE, run_id="run-1")


def harness_terminates(exit_code: int, reason: str) -> Callable[[dict[str, Any]], None]:
    """The kubelet's view once the harness container ended and the sidecar runs on."""

    def mutate(pod: dict[str, Any]) -> None:
        for status in pod["status"]["containerStatuses"]:
            if status["name"] == "harness":
                started = status["state"]["running"]["startedAt"]
                status["ready"] = False
                status["state"] = {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": reason,
                        "startedAt": started,
                        "finishedAt": started,
                    }
                }

    return mutate


@pytest.mark.parametrize(
    ("exit_code", "reason", "kind"),
    [(0, "Completed", ExitKind.EXITED), (3, "Error", ExitKind.EXITED), (137, "OOMKilled", ExitKind.OOM)],
)
async def test_a_harness_that_ends_beside_a_running_sidecar_ends_the_attempt(
    fake_k8s, runner, make_launch, exit_code, reason, kind
) -> None:
    launch = make_launch("r1")
    handle = await runner.launch(launch)
    fake_k8s.write_log(handle.job_name, "FINAL ANSWER: 4\n")
    with fake_k8s._lock:  # the fake has no driver for "one container ended, the pod runs on"
        fake_k8s._update_pods("default", handle.job_name, harness_terminates(exit_code, reason))
    # Before the fix the attempt waited for activeDeadlineSeconds (then TIMEOUT): this timed out.
    exit_ = await asyncio.wait_for(handle.wait(), 60)
    assert (exit_.kind, exit_.exit_code) == (kind, exit_code)
    assert (launch.log_dir / "stdout.log").read_text() == "FINAL ANSWER: 4\n"
    await until(lambda: fake_k8s.job(handle.job_name) is None)  # the sidecar is stopped
    # The log was read before the Job (and with it the pod) was deleted.
    order = [
        "log" if path.endswith("/log") else "delete"
        for method, path, _ in fake_k8s.requests
        if path.endswith("/log") or (method == "DELETE" and path.endswith(f"/jobs/{handle.job_name}"))
    ]
    assert order[:2] == ["log", "delete"]


# ---- the pure rule: only a harness that ended by itself ------------------------------------------
NOW = parse_time("2025-01-01T00:10:00Z")
T0 = "2025-01-01T00:09:00Z"  # a minute before NOW, well inside the deadline


def observed(*, pod_meta: dict[str, Any] | None = None, job_status: dict[str, Any] | None = None, **states):
    statuses = [{"name": name, "state": state} for name, state in states.items()]
    pod = {
        "metadata": {
            "name": "j-abcde",
            "creationTimestamp": T0,
            "labels": {"job-name": "j"},
            "annotations": {"harnessrl/harness-container": "harness"},
            **(pod_meta or {}),
        },
        "status": {"phase": "Running", "containerStatuses": statuses},
    }
    job = {
        "metadata": {"name": "j", "creationTimestamp": T0, "uid": "uid-j"},
        "spec": {"activeDeadlineSeconds": 180},
        "status": {"startTime": T0, "active": 1, **(job_status or {})},
    }
    return parse_job(job, [parse_pod(pod)])


ENDED = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": T0}}
KILLED = {"terminated": {"exitCode": 143, "reason": "Error", "startedAt": T0}}
RUNNING = {"running": {"startedAt": T0}}


def test_the_harness_exit_is_the_outcome_only_while_a_sidecar_keeps_the_pod() -> None:
    exit_ = classify(observed(harness=ENDED, sidecar=RUNNING), now=NOW, stuck_pending_s=300)
    assert exit_ is not None and (exit_.kind, exit_.exit_code) == (ExitKind.EXITED, 0)
    # Every container ended: the pod and the Job end by themselves, with their own outcome.
    assert classify(observed(harness=ENDED, sidecar=KILLED), now=NOW, stuck_pending_s=300) is None
    # Still running: nothing to say.
    assert classify(observed(harness=RUNNING, sidecar=RUNNING), now=NOW, stuck_pending_s=300) is None


@pytest.mark.parametrize(
    "case",
    [
        {"pod_meta": {"deletionTimestamp": T0}},  # the pod is being deleted: the kubelet killed it
        {"job_status": {"conditions": [{"type": "FailureTarget", "status": "True", "reason": "X"}]}},
    ],
    ids=["pod-deleting", "job-failing"],
)
def test_a_harness_killed_with_its_pod_is_not_read_as_its_own_exit(case) -> None:
    assert classify(observed(harness=KILLED, sidecar=RUNNING, **case), now=NOW, stuck_pending_s=300) is None


def test_past_the_deadline_the_deadline_decides() -> None:
    late = NOW + 600  # the Job's deadline (T0 + 180 s) has passed
    assert classify(observed(harness=KILLED, sidecar=RUNNING), now=late, stuck_pending_s=300) is None


def test_a_job_failed_by_a_sidecar_after_the_harness_exited_0_is_the_harnesss_outcome() -> None:
    """Bug: the harness exited 0, a sidecar exited 1, the pod (and the Job) failed: INFRA, a retry of
    an attempt that ran to its end (and one the agent could buy by crashing a sidecar through the
    pod's shared localhost). The same pod seen a moment earlier (the sidecar still running) was the
    harness's EXITED 0 already."""
    crashed = {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": T0}}
    failed = {
        "active": 0,
        "failed": 1,
        "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}],
    }
    job = observed(harness=ENDED, sidecar=crashed, job_status=failed)
    exit_ = classify(job, now=NOW, stuck_pending_s=300)
    assert exit_ is not None and (exit_.kind, exit_.exit_code) == (ExitKind.EXITED, 0)
    # Control: a harness that never started (no startedAt) is still no outcome of the policy's.
    never = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    exit_ = classify(
        observed(harness=never, sidecar=crashed, job_status=failed), now=NOW, stuck_pending_s=300
    )
    assert exit_ is not None and exit_.kind is ExitKind.INFRA
