"""The reconcile step as a pure function: desired attempts + observed Jobs -> actions.

``plan`` never talks to the API; the runner feeds it what a list/watch observed and executes the
``Plan``. That keeps the rules testable without a cluster and makes the loop idempotent: the Job name
is derived from (run, rollout, attempt), a Job that exists is never created again, so a restarted
controller that plans over the same cluster state adopts its predecessor's Jobs instead of
duplicating them.

``classify`` maps what Kubernetes reports to an ``Exit``. The rule of thumb: if the harness process
ran and ended, it is the policy's outcome (exit code, OOM, own deadline, a storage limit it overran);
if the pod never ran, never got its full time, or the node took it away for reasons of its own, it
is infrastructure and the attempt is retried. The agent must not be able to move itself from the
first group to the second (docs/rollout.md): every INFRA rule rests on evidence only the cluster
writes (pod status, kubelet messages), never on anything the harness controls. The table is in
docs/kubernetes.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from harnessrl.controller.base import Exit, ExitKind
from harnessrl.controller.kubernetes.names import (
    ATTEMPT_ANNOTATION,
    CONTROLLER_LABEL,
    ROLLOUT_ANNOTATION,
    label_value,
)
from harnessrl.controller.kubernetes.observed import (
    ContainerStatus,
    ObservedJob,
    ObservedPod,
    ObservedSecret,
    parse_quantity,
)

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
# The kubelet's eviction messages (pkg/kubelet/eviction/helpers.go) for a pod that overran a limit it
# was given: its total ephemeral storage, an emptyDir's sizeLimit, a container's own limit (the
# harness's is checked by name: a sidecar's overrun is not the agent's). The harness is the pod's
# only untrusted writer, so these are the policy's outcome, as the local runner's caps are.
_POD_STORAGE_LIMIT = re.compile(r"Pod ephemeral local storage usage exceeds the total limit of containers")
_EMPTYDIR_LIMIT = re.compile(r"Usage of EmptyDir volume \S+ exceeds the limit")
_CONTAINER_LIMIT = re.compile(r"Container (\S+) exceeded its local ephemeral storage limit")
# Node-pressure evictions name the pressured resource and every container using more than it
# requested; that alone blames no one (a pod within its limits on an overcommitted node), so only a
# harness using more than its own limit of that resource is the policy's doing.
_NODE_PRESSURE = re.compile(r"The node was low on resource: ([A-Za-z0-9./-]+?)\.(?:\s|$)")
_CONTAINER_USAGE = re.compile(r"Container (\S+) was using (\S+), which exceeds its request of")
# Node pressure on inodes or PIDs (the kubelet's resourceInodes / resourcePids): a pod has no limit
# of either to weigh it against and the message names no container, and making millions of files
# or a fork bomb is something the agent can do at will. Once the harness ran, such an eviction is
# the policy's outcome; were it INFRA, a failing agent could turn its 0 into a retry.
_AGENT_MADE_PRESSURE = frozenset({"inodes", "pids"})
# Kubernetes timestamps have whole seconds: the harness's start and the Job's may each read up to 1 s low.
_CLOCK_SLACK_S = 2.0


@dataclass(frozen=True)
class DesiredAttempt:
    """An attempt the controller wants running (launched and not yet resolved)."""

    name: str  # Job (and Secret) name, see names.resource_name
    rollout_id: str
    attempt: int
    created: bool = False  # this runner created (or adopted) its Job
    vanished: bool = False  # created, then seen gone (deleted by hand, TTL before we looked)
    harness_started_at: float | None = None  # the runner saw the harness container running from then
    timeout_s: float | None = None  # the harness's own time (the Job's deadline adds the startup allowance)


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


def _harness_name(pod: ObservedPod) -> str | None:
    harness = pod.harness()
    return pod.harness_container or (harness.name if harness is not None else None)


def _overran_own_limit(pod: ObservedPod, message: str) -> bool:
    """An eviction ``message`` that blames this pod's own usage: of a limit it was given, or of
    the node's inodes or PIDs (``_AGENT_MADE_PRESSURE``), which the agent can exhaust at will."""
    if _POD_STORAGE_LIMIT.search(message) or _EMPTYDIR_LIMIT.search(message):
        return True
    harness = _harness_name(pod)
    if any(name == harness for name in _CONTAINER_LIMIT.findall(message)):
        return True
    pressure = _NODE_PRESSURE.search(message)
    if pressure is not None and pressure.group(1) in _AGENT_MADE_PRESSURE:
        return True
    limit = pod.harness_limits.get(pressure.group(1)) if pressure else None
    if limit is None:
        return False
    for name, usage in _CONTAINER_USAGE.findall(message):
        used = parse_quantity(usage.rstrip(","))
        if name == harness and used is not None and used > limit:
            return True
    return False


def _pod_outcome(pod: ObservedPod, *, harness_ran: bool) -> Exit | None:
    """Evidence on a pod that it was taken away: by the node or cluster (INFRA), or by the kubelet
    for overrunning its own limits once the harness ran (RESOURCE_LIMIT: the agent filled its disk;
    before that, the seed copy of the image's workspace did, which is no policy's doing)."""
    disruption = pod.condition("DisruptionTarget")
    disrupted = disruption is not None and disruption.true
    evicted = pod.phase == "Failed" and pod.reason and pod.reason != "DeadlineExceeded"
    harness = pod.harness()
    if (disrupted or evicted) and (harness_ran or (harness is not None and harness.started)):
        message = " ".join(m for m in (pod.message, disruption.message if disrupted else "") if m)
        if _overran_own_limit(pod, message):
            return Exit(ExitKind.RESOURCE_LIMIT, None, f"pod {pod.name} evicted for its own usage: {message}")
    if disrupted:
        return _infra(f"pod {pod.name} disrupted: {disruption.reason} {disruption.message}".strip())
    if evicted:
        return _infra(f"pod {pod.name} failed: {pod.reason} {pod.message}".strip())  # Evicted, NodeLost...
    for init in (c for c in pod.containers if c.init and not c.sidecar):
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


def _deadline(
    job: ObservedJob, harness_started_at: float | None, timeout_s: float | None, *, now: float
) -> Exit:
    """``DeadlineExceeded`` is the policy's TIMEOUT only if the harness ran and had its whole time.

    Kubernetes' deadline counts from the Job's start, scheduling and pulls included: a harness that
    was never seen running (no pod, a pull that never ended, pods deleted before the runner looked)
    did not run out of its own time, nor did one whose start came so late that the deadline cut its
    ``timeout_s`` short."""
    pod = job.newest_pod()
    harness = pod.harness() if pod is not None else None
    seen = [t for t in (harness_started_at, job.harness_started_at()) if t is not None]
    started_at = min(seen, default=None)
    if started_at is None and not (harness is not None and harness.started):
        state = (harness.reason or harness.state) if harness is not None else "no pod running"
        return _infra(f"deadline exceeded before the harness was seen running ({state})")
    failed = job.failed_condition
    if job.start_time is not None and job.active_deadline_s is not None:
        deadline_at = job.start_time + job.active_deadline_s
    else:
        deadline_at = failed.since if failed is not None and failed.since is not None else now
    if (
        started_at is not None
        and timeout_s is not None
        and started_at + timeout_s > deadline_at + _CLOCK_SLACK_S
    ):
        return _infra(
            f"deadline exceeded {deadline_at - started_at:.0f}s after the harness started, short of its "
            f"{timeout_s:.0f}s (scheduling/pull took longer than startup_allowance_s)"
        )
    message = failed.message if failed is not None else ""
    return Exit(ExitKind.TIMEOUT, None, message or "activeDeadlineSeconds exceeded")


def _harness_exit(harness: ContainerStatus) -> Exit | None:
    """The outcome a terminated harness container reports by itself (None: exit 0 or no code)."""
    if harness.reason == "OOMKilled":
        return Exit(ExitKind.OOM, harness.exit_code, "container OOMKilled")
    if harness.reason in START_FAILURES:
        return _infra(f"harness container could not start: {harness.reason} {harness.message}".strip())
    if harness.exit_code not in (0, None):
        return Exit(ExitKind.EXITED, harness.exit_code, f"container exited {harness.exit_code}")
    return None


def _ended_beside_sidecars(job: ObservedJob, pod: ObservedPod | None, *, now: float) -> Exit | None:
    """The harness container ended while another regular container of the pod (a sidecar of the
    template: a log shipper, a proxy) runs on. That container keeps the pod, and so the Job, running
    until ``activeDeadlineSeconds``, which would read as the policy's TIMEOUT for a harness that had
    long exited: its own exit is the outcome. Not while the pod is being deleted or the Job is
    failing or past its deadline: then the kubelet's kill, not the harness, ended it."""
    if pod is None or pod.phase != "Running" or pod.deleting:
        return None
    if job.deleting or job.condition("FailureTarget") is not None:
        return None
    deadline = job.active_deadline_s
    if job.start_time is not None and deadline is not None and now >= job.start_time + deadline:
        return None
    harness = pod.harness()
    if harness is None or harness.state != "terminated" or harness.exit_code is None:
        return None
    others = [c for c in pod.containers if not c.init and c.name != harness.name]
    if not any(c.state != "terminated" for c in others):
        return None  # the pod itself is about to end: the Job's own outcome follows
    exit_ = _harness_exit(harness)
    if exit_ is not None:
        return exit_
    return Exit(ExitKind.EXITED, 0, "harness exited 0 (the pod's other containers ran on)")


def _past_its_time(job: ObservedJob, exit_: Exit | None, timeout_s: float | None) -> Exit | None:
    """``exit_``, unless the harness that reported it ran longer than its ``timeout_s``: then TIMEOUT.

    The Job's deadline is ``timeout_s + startup_allowance_s`` from the Job's start, so a harness that
    started at once could run on into the allowance and end well there (an exit 0 past its time),
    where the local runner kills it at ``timeout_s``. Measured on the container's own
    ``startedAt``/``finishedAt`` (one node's clock)."""
    if exit_ is None or exit_.kind not in (ExitKind.EXITED, ExitKind.OOM) or timeout_s is None:
        return exit_
    pod = job.newest_pod()
    harness = pod.harness() if pod is not None else None
    if harness is None or harness.state != "terminated":
        return exit_
    if harness.started_at is None or harness.finished_at is None:
        return exit_
    ran = harness.finished_at - harness.started_at
    if ran > timeout_s + _CLOCK_SLACK_S:
        return Exit(
            ExitKind.TIMEOUT,
            None,
            f"the harness ran {ran:.0f}s, past its timeout_s of {timeout_s:.0f}s ({exit_.detail} after it)",
        )
    return exit_


def classify(
    job: ObservedJob,
    *,
    now: float,
    stuck_pending_s: float,
    harness_started_at: float | None = None,
    timeout_s: float | None = None,
) -> Exit | None:
    """How the attempt behind ``job`` ended, or None while it is still running normally.
    ``harness_started_at``: when the runner saw the harness running in an earlier observation (the
    pods may be gone now); ``timeout_s``: the harness's own time (the Job's deadline is longer): a
    harness that ran past it is a TIMEOUT however it ended (``_past_its_time``)."""
    exit_ = _classify(
        job,
        now=now,
        stuck_pending_s=stuck_pending_s,
        harness_started_at=harness_started_at,
        timeout_s=timeout_s,
    )
    return _past_its_time(job, exit_, timeout_s)


def _classify(
    job: ObservedJob,
    *,
    now: float,
    stuck_pending_s: float,
    harness_started_at: float | None,
    timeout_s: float | None,
) -> Exit | None:
    if job.complete:
        return Exit(ExitKind.EXITED, 0, "job succeeded")
    pod = job.newest_pod()
    harness_ran = harness_started_at is not None
    if pod is not None and (taken := _pod_outcome(pod, harness_ran=harness_ran)) is not None:
        return taken
    failed = job.failed_condition
    if failed is None:
        ended = _ended_beside_sidecars(job, pod, now=now)
        return ended if ended is not None else _stuck(job, now=now, stuck_pending_s=stuck_pending_s)
    if failed.reason == "DeadlineExceeded":
        return _deadline(job, harness_started_at, timeout_s, now=now)
    harness = pod.harness() if pod is not None else None
    if harness is not None and harness.state == "terminated":
        if (exit_ := _harness_exit(harness)) is not None:
            return exit_
        if harness.exit_code == 0 and harness.started:
            # The harness ended well by itself; another container of the pod (a sidecar) failed it.
            # Its exit is the outcome, as when the sidecar ends after it is seen exiting
            # (_ended_beside_sidecars); INFRA here would let an agent that can crash a sidecar over
            # the pod's shared localhost turn its own result into a retry.
            return Exit(ExitKind.EXITED, 0, f"harness exited 0; the Job failed: {failed.reason}")
    if failed.reason in INFRA_JOB_REASONS:
        return _infra(f"job failed: {failed.reason} {failed.message}".strip())
    return _infra(f"job failed ({failed.reason or 'no reason'}) and no pod status says why: {failed.message}")


def _orphan(
    labels: Mapping[str, str], annotations: Mapping[str, str], *, owner: str | None, latest: Mapping[str, int]
) -> bool:
    """A Job this runner may delete though it did not ask for it: one it created itself
    (``owner``: its controller label) that no attempt of it wants any more, or one of an attempt
    that a later attempt of the same rollout, launched here, supersedes (the store gives every
    retry a new attempt and refuses the old one's result; whoever ran it is gone or will kill it).
    Anything else, another live controller's Jobs first of all, is not ours to touch."""
    if owner is not None and labels.get(CONTROLLER_LABEL) == label_value(owner):
        return True
    newest = latest.get(annotations.get(ROLLOUT_ANNOTATION, ""))
    attempt = annotations.get(ATTEMPT_ANNOTATION, "")
    return newest is not None and attempt.isdigit() and int(attempt) < newest


def plan(
    desired: Sequence[DesiredAttempt],
    observed: Mapping[str, ObservedJob],
    *,
    max_concurrent: int,
    now: float,
    stuck_pending_s: float = 300.0,
    delete_orphans: bool = True,
    observed_secrets: Mapping[str, ObservedSecret] | None = None,
    orphan_secret_grace_s: float = 300.0,
    owner: str | None = None,
) -> Plan:
    """Actions that move the observed Jobs toward ``desired``. ``desired`` is in launch order; free
    slots go to the earliest. ``observed`` holds the Jobs of this runner's run (its label selector),
    which other controllers of the run share: only ``_orphan`` ones are deleted (``owner`` is this
    runner's controller id). ``delete_orphans`` is False for a while after the runner starts."""
    result = Plan()
    desired_names = {d.name for d in desired}
    latest: dict[str, int] = {}
    for d in desired:
        latest[d.rollout_id] = max(d.attempt, latest.get(d.rollout_id, d.attempt))

    for d in desired:
        job = observed.get(d.name)
        if job is not None and not d.created:
            result.adopted.append(d.name)
        if job is None:
            if d.vanished:
                result.completed[d.name] = _infra("job disappeared before its outcome was observed")
            continue
        exit_ = classify(
            job,
            now=now,
            stuck_pending_s=stuck_pending_s,
            harness_started_at=d.harness_started_at,
            timeout_s=d.timeout_s,
        )
        if exit_ is not None:
            result.completed[d.name] = exit_
            if not job.finished and not job.deleting:  # stuck pods keep running until deleted
                result.delete.append(d.name)

    if delete_orphans:  # finished orphans are left to ttlSecondsAfterFinished (their logs stay readable)
        result.delete += [
            n
            for n, j in observed.items()
            if n not in desired_names
            and not j.finished
            and not j.deleting
            and _orphan(j.labels, j.annotations, owner=owner, latest=latest)
        ]

    # Slots: every unfinished Job counts (other controllers' of the run, orphans and ones being
    # deleted still hold pods), and so does a Job we created that a stale list does not show yet.
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

    # A Secret with no Job and no attempt of this runner is useless whoever wrote it: its attempt
    # ended and the owner reference that lets the garbage collector take it was never set, or its
    # controller died between the Secret and the Job. Unlike a Job, another controller's counts too
    # (a dead one's carries its id forever). What protects a live controller's Secret whose Job is
    # still being created is the grace: it rewrites the Secret on every try (``written_at``), and the
    # runner keeps the grace above the time one try can take.
    for name, secret in (observed_secrets or {}).items() if delete_orphans else ():
        if name in desired_names or name in observed:
            continue
        written = secret.written_at
        if written is None or now - written >= orphan_secret_grace_s:
            result.delete_secrets.append(name)
    return result
