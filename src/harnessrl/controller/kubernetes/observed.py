"""What the reconcile loop knows about a Job: small frozen dataclasses parsed from API JSON.

The parsers take the JSON shapes of the REST API (camelCase dicts, as a list/watch returns them), so
the planning code is pure and testable without a client or a cluster. Only the fields the failure
mapping needs are kept.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from harnessrl.controller.kubernetes.names import CONTAINER_ANNOTATION, WRITTEN_AT_ANNOTATION


def parse_time(value: str | None) -> float | None:
    """RFC 3339 timestamp (``2024-05-01T12:00:00Z``) -> epoch seconds."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:[eE]([+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$"
)
_SUFFIX = {
    **{s: 1024**i for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), start=1)},
    **{s: 1000**i for i, s in enumerate(("k", "M", "G", "T", "P", "E"), start=1)},
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
}


def parse_quantity(value: object) -> float | None:
    """A Kubernetes quantity (``10Gi``, ``500m``, ``1e3``, ``2``) -> a number; None if it is not one,
    or too large for a float (``1e400``: computed as ``10 ** 400`` it raised OverflowError, a
    traceback where the config should have named its field)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
        return number if math.isfinite(number) else None
    match = _QUANTITY.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        return None
    number, exponent, suffix = match.groups()
    # float() of the decimal text saturates to inf instead of raising; inf is no quantity to compare
    parsed = float(f"{number}e{exponent}") if exponent else float(number) * _SUFFIX.get(suffix or "", 1)
    return parsed if math.isfinite(parsed) else None


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str = ""
    message: str = ""
    since: float | None = None  # lastTransitionTime

    @property
    def true(self) -> bool:
        return self.status == "True"


@dataclass(frozen=True)
class ContainerStatus:
    name: str
    state: str  # waiting | running | terminated | unknown
    reason: str = ""
    message: str = ""
    exit_code: int | None = None
    started: bool = False  # ever ran: running now, or terminated with a startedAt
    init: bool = False
    started_at: float | None = None  # when it started running (the kubelet's startedAt)
    finished_at: float | None = None  # when it ended (the kubelet's finishedAt; same node clock)
    # A native sidecar: an init container with ``restartPolicy: Always`` (Istio injects them). It
    # runs beside the harness and is SIGTERMed (exit 143) when the harness ends: no failure of setup.
    sidecar: bool = False


@dataclass(frozen=True)
class ObservedPod:
    name: str
    job_name: str
    phase: str = "Pending"
    reason: str = ""  # pod-level reason (Evicted, NodeLost, ...): set by the node, not the container
    message: str = ""
    conditions: tuple[Condition, ...] = ()
    containers: tuple[ContainerStatus, ...] = ()
    harness_container: str | None = None
    created_at: float | None = None
    # The harness container's ``resources.limits`` from the pod spec, as numbers (bytes, cores):
    # what the node's eviction messages are weighed against.
    harness_limits: Mapping[str, float] = field(default_factory=dict)
    deleting: bool = False  # metadata.deletionTimestamp: its containers are being killed

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    def harness(self) -> ContainerStatus | None:
        regular = [c for c in self.containers if not c.init]
        wanted = [c for c in regular if c.name == self.harness_container]
        return (wanted or regular or [None])[0]


@dataclass(frozen=True)
class ObservedJob:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    active: int = 0
    succeeded: int = 0
    failed: int = 0
    conditions: tuple[Condition, ...] = ()
    created_at: float | None = None
    start_time: float | None = None
    deleting: bool = False
    uid: str = ""
    pods: tuple[ObservedPod, ...] = ()
    active_deadline_s: float | None = None  # spec.activeDeadlineSeconds

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_ and c.true), None)

    @property
    def complete(self) -> bool:
        return self.succeeded > 0 or self.condition("Complete") is not None

    @property
    def failed_condition(self) -> Condition | None:
        return self.condition("Failed")

    @property
    def finished(self) -> bool:
        """Terminal as far as the Job controller is concerned (its pods no longer run)."""
        return self.complete or self.failed_condition is not None

    def newest_pod(self) -> ObservedPod | None:
        return max(self.pods, key=lambda p: (p.created_at or 0.0, p.name), default=None)

    def harness_started_at(self) -> float | None:
        """When the harness container of one of its pods started running, if any pod says so."""
        times = [h.started_at for p in self.pods if (h := p.harness()) is not None and h.started_at]
        return min(times, default=None)


@dataclass(frozen=True)
class ObservedSecret:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    created_at: float | None = None

    @property
    def written_at(self) -> float | None:
        """When it was last written: its creation, or a later rewrite (a create retried after the
        Secret already existed keeps the old creationTimestamp, so the runner stamps each write)."""
        try:
            stamped = float(self.annotations.get(WRITTEN_AT_ANNOTATION, ""))
        except ValueError:
            stamped = None
        times = [t for t in (self.created_at, stamped) if t is not None and math.isfinite(t)]
        return max(times, default=None)


def _conditions(raw: Iterable[Mapping[str, Any]] | None) -> tuple[Condition, ...]:
    return tuple(
        Condition(
            type=c.get("type", ""),
            status=c.get("status", ""),
            reason=c.get("reason") or "",
            message=c.get("message") or "",
            since=parse_time(c.get("lastTransitionTime")),
        )
        for c in raw or ()
    )


def _container(raw: Mapping[str, Any], *, init: bool) -> ContainerStatus:
    state = raw.get("state") or {}
    if "terminated" in state and state["terminated"] is not None:
        t = state["terminated"]
        return ContainerStatus(
            raw.get("name", ""),
            "terminated",
            t.get("reason") or "",
            t.get("message") or "",
            t.get("exitCode"),
            started=bool(t.get("startedAt")),
            init=init,
            started_at=parse_time(t.get("startedAt")),
            finished_at=parse_time(t.get("finishedAt")),
        )
    if "running" in state and state["running"] is not None:
        started_at = parse_time(state["running"].get("startedAt"))
        return ContainerStatus(raw.get("name", ""), "running", started=True, init=init, started_at=started_at)
    if "waiting" in state and state["waiting"] is not None:
        w = state["waiting"]
        # A waiting container that ran before (lastState) counts as started.
        started = bool(((raw.get("lastState") or {}).get("terminated") or {}).get("startedAt"))
        return ContainerStatus(
            raw.get("name", ""),
            "waiting",
            w.get("reason") or "",
            w.get("message") or "",
            started=started,
            init=init,
        )
    return ContainerStatus(raw.get("name", ""), "unknown", init=init)


def _harness_limits(spec: Mapping[str, Any], harness: str | None) -> dict[str, float]:
    containers = [c for c in spec.get("containers") or () if isinstance(c, Mapping)]
    wanted = [c for c in containers if c.get("name") == harness]
    container = (wanted or containers or [{}])[0]
    limits = (container.get("resources") or {}).get("limits") or {}
    parsed = {name: parse_quantity(value) for name, value in limits.items()}
    return {name: value for name, value in parsed.items() if value is not None}


def _sidecar_names(spec: Mapping[str, Any]) -> set[str]:
    """Init containers of the pod spec with ``restartPolicy: Always`` (native sidecars)."""
    return {
        c.get("name", "")
        for c in spec.get("initContainers") or ()
        if isinstance(c, Mapping) and c.get("restartPolicy") == "Always"
    }


def parse_pod(obj: Mapping[str, Any]) -> ObservedPod:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    labels = meta.get("labels") or {}
    harness = (meta.get("annotations") or {}).get(CONTAINER_ANNOTATION)
    sidecars = _sidecar_names(obj.get("spec") or {})
    containers = [
        replace(status_, sidecar=status_.name in sidecars)
        for status_ in (_container(c, init=True) for c in status.get("initContainerStatuses") or ())
    ]
    containers += [_container(c, init=False) for c in status.get("containerStatuses") or ()]
    return ObservedPod(
        name=meta.get("name", ""),
        job_name=labels.get("batch.kubernetes.io/job-name") or labels.get("job-name", ""),
        phase=status.get("phase") or "Pending",
        reason=status.get("reason") or "",
        message=status.get("message") or "",
        conditions=_conditions(status.get("conditions")),
        containers=tuple(containers),
        harness_container=harness,
        created_at=parse_time(meta.get("creationTimestamp")),
        harness_limits=_harness_limits(obj.get("spec") or {}, harness),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def parse_job(obj: Mapping[str, Any], pods: Iterable[ObservedPod] = ()) -> ObservedJob:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    return ObservedJob(
        name=meta.get("name", ""),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        active=status.get("active") or 0,
        succeeded=status.get("succeeded") or 0,
        failed=status.get("failed") or 0,
        conditions=_conditions(status.get("conditions")),
        created_at=parse_time(meta.get("creationTimestamp")),
        start_time=parse_time(status.get("startTime")),
        deleting=bool(meta.get("deletionTimestamp")),
        uid=meta.get("uid") or "",
        pods=tuple(pods),
        active_deadline_s=(obj.get("spec") or {}).get("activeDeadlineSeconds"),
    )


def parse_secret(obj: Mapping[str, Any]) -> ObservedSecret:
    meta = obj.get("metadata") or {}
    return ObservedSecret(
        name=meta.get("name", ""),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        created_at=parse_time(meta.get("creationTimestamp")),
    )


def attach_pods(jobs: Mapping[str, ObservedJob], pods: Iterable[ObservedPod]) -> dict[str, ObservedJob]:
    """Jobs with their pods (matched by the ``job-name`` label) replacing whatever they had."""
    by_job: dict[str, list[ObservedPod]] = {}
    for pod in pods:
        by_job.setdefault(pod.job_name, []).append(pod)
    return {name: replace(job, pods=tuple(by_job.get(name, ()))) for name, job in jobs.items()}
