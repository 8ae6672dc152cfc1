"""The runner's book: the attempts it launched and the run's Jobs, pods and Secrets as it last saw them.

An ``Attempt`` is one rollout attempt's Job as the runner wants it (its rendered manifests, whether
its Job exists, its create's back-off) and the two futures ``launch`` and ``wait`` return on.
``RunBook`` is shared by the reconcile loop, the creates and the watch callback, all on the event
loop: an attempt leaves the book when it ends, its futures settled once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from harnessrl.controller.base import Exit, ExitKind, Launch
from harnessrl.controller.kubernetes.names import KEY_DIGEST_ANNOTATION
from harnessrl.controller.kubernetes.observed import ObservedJob, ObservedPod, ObservedSecret


def settle(future: asyncio.Future, value: Any = None, exc: BaseException | None = None) -> None:
    """Set ``future``'s result (or ``exc``) unless it is set already."""
    if not future.done():
        future.set_exception(exc) if exc is not None else future.set_result(value)


@dataclass(eq=False)
class Attempt:
    name: str
    launch: Launch
    job: dict[str, Any]
    secret: dict[str, Any]
    created: asyncio.Future[None]  # the Job exists (created or adopted)
    done: asyncio.Future[Exit]
    is_created: bool = False
    created_seq: int = 0
    vanished: bool = False
    harness_started_at: float | None = None  # earliest start of the harness container seen in a pod
    create_failures: int = 0  # transient create refusals in a row (429, 5xx, quota): back off
    retry_at: float = 0.0  # time.monotonic() before which the create is not tried again
    # time.monotonic() of the first of the 429/5xx refusals of its create in a row: past
    # ``stuck_pending_s`` of them the launch fails (it waited for an answer forever)
    erroring_since: float | None = None

    def is_foreign(self, annotations: Any) -> bool:
        """A Job of this attempt's name made for another rollout key: another store's rollout of the
        same id under the same run id (a run started afresh, a second deployment). Jobs without the
        digest (older harnessrl) are taken as the attempt's, as before."""
        theirs = (annotations or {}).get(KEY_DIGEST_ANNOTATION)
        return theirs is not None and theirs != self.job["metadata"]["annotations"][KEY_DIGEST_ANNOTATION]

    def seen_running(self, job: ObservedJob | None) -> float | None:
        """Record when the harness was first seen running: its pods may be gone by the time the Job
        fails (a deadline deletes them), and only a harness that ran can time out."""
        started = job.harness_started_at() if job is not None else None
        if started is not None and (self.harness_started_at is None or started < self.harness_started_at):
            self.harness_started_at = started
        return self.harness_started_at


@dataclass(eq=False)
class RunBook:
    attempts: dict[str, Attempt] = field(default_factory=dict)  # launch order = order slots are handed out
    jobs: dict[str, ObservedJob] = field(default_factory=dict)
    pods: list[ObservedPod] = field(default_factory=list)
    secrets: dict[str, ObservedSecret] = field(default_factory=dict)
    seq: int = 0  # orders our creates against list snapshots (see KubernetesRunner._full_list)

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def mark_created(self, attempt: Attempt) -> None:
        """The attempt's Job exists: ``launch`` returns."""
        attempt.is_created, attempt.created_seq = True, self.next_seq()
        settle(attempt.created)

    def fail(self, attempt: Attempt, error: Exception) -> None:
        """The attempt never got its Job: ``launch`` raises ``error``, ``wait`` says INFRA."""
        self.attempts.pop(attempt.name, None)
        settle(attempt.created, exc=error)
        settle(attempt.done, Exit(ExitKind.INFRA, None, str(error)))

    def last_pod(self, job_name: str) -> ObservedPod | None:
        """The newest pod of ``job_name`` listed."""
        pods = [p for p in self.pods if p.job_name == job_name]
        return max(pods, key=lambda p: (p.created_at or 0.0, p.name), default=None)
