"""The reconcile step as a pure function: desired attempts + observed Jobs -> actions.

``plan`` never talks to the API; the runner feeds it what a list/watch observed and executes the
``Plan``. That keeps the rules testable without a cluster and makes the loop idempotent: the Job name
is derived from (run, rollout, attempt), a Job that exists is never created again, so a restarted
controller that plans over the same cluster state adopts its predecessor's Jobs instead of
duplicating them.

``classify`` maps what Kubernetes reports to an ``Exit``. The rule of thumb: if the harness process
ran and ended, it is the policy's outcome (exit code, OOM, own deadline); if the pod never ran or the
node took it away, it is infrastructure and the attempt is retried. The table is in
docs/kubernetes.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from harnessrl.controller.base import Exit, ExitKind
from harnessrl.controller.kubernetes.observed import ObservedJob, ObservedPod

# Waiting reasons that will not fix themselves: fail the attempt at once.
PERMANENT_WAITING = frozenset({"InvalidImageName", "ErrImageNeverPull"})
# Waiting reasons that can be transient (registry hiccup, a ConfigMap that appears later): fail the
# attempt as infrastructure once the pod has been stuck longer than ``stuck_pending_s``.
STUCK_WAITING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "RegistryUnavailable",
        "CreateContainerConfigError",
        "CreateContainerError",
        "PreCreateHookError",
        "PostStartHookError",
    }
)
# Terminated reasons that mean the container could not be started at all (bad binary, mount failure).
START_FAILURES = frozenset({"StartError", "ContainerCannotRun"})
# Job-level failure reasons that mean the node or a pod failure policy ended the Job.
INFRA_JOB_REASONS = frozenset({"PodFailurePolicy"})


@dataclass(frozen=True)
class DesiredAttempt:
    """An attempt the controller wants running (launched and not yet resolved)."""

    name: str  # Job (and Secret) name, see names.resource_name
    rollout_id: str
    attempt: int
    created: bool = False  # this runner created (or adopted) its Job
    vanished: bool = False  # created, then seen gone (deleted by hand, TTL before we looked)


@dataclass
class Plan:
    create: list[DesiredAttempt] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)  # Job names, deleted with Background propagation
    delete_secrets: list[str] = field(default_factory=list)
    completed: dict[str, Exit] = field(default_factory=dict)  # Job name -> how the attempt ended
    waiting: list[str] = field(default_factory=list)  # desired, not created for lack of a slot
    adopted: list[str] = field(default_factory=list)  # desired, not created by us, but the Job exists


def _infra(detail: str) -> Exit:
    return Exit(ExitKind.INFRA, None, detail)


def _pod_infra(pod: ObservedPod) -> Exit | None:
    """Evidence on a pod that the node or cluster, not the harness, ended it."""
    disruption = pod.condition("DisruptionTarget")
    if disruption is not None and disruption.true:
        return _infra(f"pod {pod.name} disrupted: {disruption.reason} {disruption.message}".strip())
    if pod.phase == "Failed" and pod.reason and pod.reason != "DeadlineExceeded":
        return _infra(f"pod {pod.name} failed: {pod.reason} {pod.message}".strip())  # Evicted, NodeLost...
    for init in (c for c in pod.containers if c.init):
        if init.state == "terminated" and init.exit_code not in (0, None):
            return _infra(f"init container {init.name} exited {init.exit_code} ({init.reason})")
    return None


def _started_since(job: ObservedJob) -> float | None:
    return job.start_time or job.created_at


def _stuck(job: ObservedJob, *, now: float, stuck_pending_s: float) -> Exit | None:
    """A running Job whose pod cannot start: Kubernetes would only end it at its deadline."""
    pod = job.newest_pod()
    since = _started_since(job)
    long_enough = since is not None and now - since >= stuck_pending_s
    if pod is None:
        if job.active == 0 and long_enough:
            return _infra(f"no pod created for {stuck_pending_s:.0f}s (quota? admission webhook?)")
        return None
    for c in pod.containers:
        if c.state == "waiting" and c.reason in PERMANENT_WAITING:
            return _infra(f"container {c.name}: {c.reason} {c.message}".strip())
        if c.state == "waiting" and c.reason in STUCK_WAITING and long_enough:
            return _infra(f"container {c.name} stuck {stuck_pending_s:.0f}s: {c.reason} {c.message}".strip())
    scheduled = pod.condition("PodScheduled")
    if scheduled is not None and scheduled.status == "False" and scheduled.reason == "Unschedulable":
        pending_since = scheduled.since or since
        if pending_since is not None and now - pending_since >= stuck_pending_s:
            return _infra(f"pod unschedulable for {stuck_pending_s:.0f}s: {scheduled.message}".strip())
    return None


def classify(job: ObservedJob, *, now: float, stuck_pending_s: float) -> Exit | None:
    """How the attempt behind ``job`` ended, or None while it is still running normally."""
    if job.complete:
        return Exit(ExitKind.EXITED, 0, "job succeeded")
    pod = job.newest_pod()
    if pod is not None and (infra := _pod_infra(pod)) is not None:
        return infra
    failed = job.failed_condition
    if failed is None:
        return _stuck(job, now=now, stuck_pending_s=stuck_pending_s)
    harness = pod.harness() if pod is not None else None
    if failed.reason == "DeadlineExceeded":
        # Kubernetes' deadline counts from Job start, pulls included: a harness that never started
        # did not run out of its own time.
        if harness is not None and not harness.started and harness.state != "running":
            return _infra(f"deadline exceeded before the harness started ({harness.reason or 'pending'})")
        return Exit(ExitKind.TIMEOUT, None, failed.message or "activeDeadlineSeconds exceeded")
    if harness is not None and harness.state == "terminated":
        if harness.reason == "OOMKilled":
            return Exit(ExitKind.OOM, harness.exit_code, "container OOMKilled")
        if harness.reason in START_FAILURES:
            return _infra(f"harness container could not start: {harness.reason} {harness.message}".strip())
        if harness.exit_code not in (0, None):
            return Exit(ExitKind.EXITED, harness.exit_code, f"container exited {harness.exit_code}")
    if failed.reason in INFRA_JOB_REASONS:
        return _infra(f"job failed: {failed.reason} {failed.message}".strip())
    return _infra(f"job failed ({failed.reason or 'no reason'}) and no pod status says why: {failed.message}")


def plan(
    desired: Sequence[DesiredAttempt],
    observed: Mapping[str, ObservedJob],
    *,
    max_concurrent: int,
    now: float,
    stuck_pending_s: float = 300.0,
    delete_orphans: bool = True,
    observed_secrets: Mapping[str, float | None] | None = None,
    orphan_secret_grace_s: float = 300.0,
) -> Plan:
    """Actions that move the observed Jobs toward ``desired``. ``desired`` is in launch order; free
    slots go to the earliest. ``observed`` holds only Jobs this runner manages (its label selector).
    ``delete_orphans`` is False until a restarted controller had time to re-launch what it adopts."""
    result = Plan()
    desired_names = {d.name for d in desired}

    for d in desired:
        job = observed.get(d.name)
        if job is not None and not d.created:
            result.adopted.append(d.name)
        if job is None:
            if d.vanished:
                result.completed[d.name] = _infra("job disappeared before its outcome was observed")
            continue
        exit_ = classify(job, now=now, stuck_pending_s=stuck_pending_s)
        if exit_ is not None:
            result.completed[d.name] = exit_
            if not job.finished and not job.deleting:  # stuck pods keep running until deleted
                result.delete.append(d.name)

    if delete_orphans:  # finished orphans are left to ttlSecondsAfterFinished (their logs stay readable)
        result.delete += [
            n for n, j in observed.items() if n not in desired_names and not j.finished and not j.deleting
        ]

    # Slots: every unfinished Job counts (orphans and ones being deleted still hold pods), and so does
    # a Job we created that a stale list does not show yet.
    deleting_now = set(result.delete)
    busy = sum(1 for n, j in observed.items() if not j.finished and n not in deleting_now)
    busy += sum(1 for d in desired if d.created and not d.vanished and d.name not in observed)
    slots = max(0, max_concurrent - busy)
    for d in desired:
        if d.created or d.name in observed or d.name in result.completed:
            continue
        if slots > 0:
            result.create.append(d)
            slots -= 1
        else:
            result.waiting.append(d.name)

    for name, created_at in (observed_secrets or {}).items() if delete_orphans else ():
        if name in desired_names or name in observed:
            continue
        if created_at is None or now - created_at >= orphan_secret_grace_s:
            result.delete_secrets.append(name)
    return result
