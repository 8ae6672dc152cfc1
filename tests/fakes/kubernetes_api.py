"""A small, real HTTP fake of the Kubernetes API for tests (no cluster runs on dev/CI machines).

It serves just enough of the REST API, in the documented JSON shapes, for the official ``kubernetes``
Python client to drive it unchanged:

- batch/v1 Jobs: create, get, list (``labelSelector``), delete (``propagationPolicy``; pods and
  Secrets owned by the Job are garbage-collected unless ``Orphan``), watch (``?watch=true``: one JSON
  event per line, ADDED / MODIFIED / DELETED / ERROR, from a ``resourceVersion``; 410 Expired after
  ``compact()``; ``timeoutSeconds``);
- core/v1 Secrets: create, get, list, replace, merge-patch, delete; core/v1 Pods: get, list, watch,
  ``/log`` (pods are made by the fake's "job controller", never by clients);
- networking/v1 NetworkPolicies: create, get, list, replace, delete (empty ``ingress``/``egress``
  lists left out of what is stored, as the real server's ``omitempty`` does).

A replace (PUT) that carries a ``resourceVersion`` other than the stored one is a 409 Conflict.

Errors are ``Status`` objects with the real ``reason``/``code`` (409 AlreadyExists, 404 NotFound,
422 Invalid). Outcomes are driven by test-only methods (``succeed_job``, ``fail_job``, ``oom_job``,
``exceed_deadline``, ``set_waiting``, ``set_unschedulable``, ``evict``, ``set_running_for``), not
over HTTP; so are ``start_pods`` (what a new Job's pod looks like: running, pending, or no pod at
all, as under a full quota) and ``add_fault`` (a request answered late, or with an error Status, a given number of times).
Runs uvicorn in a thread on 127.0.0.1 and a free port.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import re
import secrets
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

# resource -> (URL prefix, apiVersion, kind, group for Status details)
RESOURCES = {
    "jobs": ("apis/batch/v1", "batch/v1", "Job", "batch"),
    "secrets": ("api/v1", "v1", "Secret", ""),
    "pods": ("api/v1", "v1", "Pod", ""),
    "networkpolicies": (
        "apis/networking.k8s.io/v1",
        "networking.k8s.io/v1",
        "NetworkPolicy",
        "networking.k8s.io",
    ),
}
READ_ONLY = {"pods"}  # created by the fake job controller only
_PATH = re.compile(
    r"^/(api/v1|apis/batch/v1|apis/networking\.k8s\.io/v1)/namespaces/([^/]+)/([a-z]+)(?:/([^/]+))?(/log)?$"
)
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _now_iso(at: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if at is None else at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(
    code: int, reason: str, message: str, *, name: str = "", kind: str = "", group: str = ""
) -> dict:
    """A ``Status`` object as the API server sends for failures."""
    details: dict[str, Any] = {"name": name, "kind": kind}
    if group:
        details["group"] = group
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details,
        "code": code,
    }


def _selector_matches(selector: str | None, labels: dict[str, str]) -> bool:
    """Equality-based selectors: ``k=v``, ``k==v``, ``k!=v``, ``k`` (exists), ``!k``, comma = AND."""
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


# The labels the API server gives a Job's pod template, and the selector it builds from them.
_JOB_UID_LABELS = ("controller-uid", "batch.kubernetes.io/controller-uid")
_JOB_NAME_LABELS = ("job-name", "batch.kubernetes.io/job-name")


def _generated_selector_error(job: dict[str, Any], name: str) -> str | None:
    """What the API server refuses in a Job whose selector it generates (no ``manualSelector:
    true``): a ``spec.selector`` given anyway, or pod template labels ``controller-uid`` /
    ``job-name`` with other values than the new Job's (its uid cannot be known before it exists).
    A Job copied from a live one (``kubectl get job -o yaml``) carries both. Kubernetes docs,
    "Jobs: Specifying your own Pod selector"; ``validateGeneratedSelector`` in
    pkg/apis/batch/validation ("`selector` not auto-generated", "must be '<value>'")."""
    spec = job.get("spec") or {}
    if spec.get("manualSelector") is True:
        return None
    if spec.get("selector") is not None:
        return "spec.selector: Invalid value: `selector` not auto-generated"
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    for key in _JOB_UID_LABELS:
        if key in labels:
            return (
                f"spec.template.metadata.labels[{key}]: Invalid value: {labels[key]!r}: must be the Job's uid"
            )
    for key in _JOB_NAME_LABELS:
        if key in labels and labels[key] != name:
            return f"spec.template.metadata.labels[{key}]: Invalid value: {labels[key]!r}: must be {name!r}"
    return None


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


@dataclass
class _Fault:
    method: str
    resource: str
    code: int | None
    reason: str
    message: str
    delay_s: float
    times: int


@dataclass
class _Watcher:
    resource: str
    namespace: str
    selector: str | None
    queue: asyncio.Queue
    loop: asyncio.AbstractEventLoop


class FakeKubernetes:
    """The fake API server. Use as a context manager; ``url`` is its base URL."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {r: {} for r in RESOURCES}
        self._history: dict[str, list[tuple[int, str, dict[str, Any]]]] = {r: [] for r in RESOURCES}
        self._compacted_rv = 0
        self._rv = 100
        self._watchers: list[_Watcher] = []
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._logs: dict[tuple[str, str], str] = {}  # (namespace, pod) -> container output
        self._faults: list[_Fault] = []
        self.serving = 0  # requests being answered now, watches not counted
        # A new Job's pod: "running" (the harness started at once), "pending" (ContainerCreating, as
        # during a slow image pull) or "none" (no pod is created, as under an exhausted quota).
        self.start_pods = "running"
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""
        self.app = Starlette(
            routes=[Route("/{path:path}", self._handle, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])]
        )

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> FakeKubernetes:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake Kubernetes API did not start")
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        with self._lock:
            for w in self._watchers:
                w.loop.call_soon_threadsafe(w.queue.put_nowait, None)
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> FakeKubernetes:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- state (thread-safe; used by handlers and by tests) -----------------------------------
    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _emit(self, resource: str, type_: str, obj: dict[str, Any], rv: int) -> None:
        snapshot = copy.deepcopy(obj)
        self._history[resource].append((rv, type_, snapshot))
        namespace = obj["metadata"].get("namespace", "")
        for w in self._watchers:
            if (
                w.resource == resource
                and w.namespace == namespace
                and _selector_matches(w.selector, obj["metadata"].get("labels") or {})
            ):
                w.loop.call_soon_threadsafe(w.queue.put_nowait, {"type": type_, "object": snapshot})

    def _store(self, resource: str, obj: dict[str, Any], type_: str) -> dict[str, Any]:
        if resource == "networkpolicies":  # Go's omitempty: the server never gives back an empty list
            spec = obj.get("spec") or {}
            for field in ("ingress", "egress"):
                if spec.get(field) == []:
                    del spec[field]
        rv = self._next_rv()
        obj["metadata"]["resourceVersion"] = str(rv)
        meta = obj["metadata"]
        self._objects[resource][(meta["namespace"], meta["name"])] = obj
        self._emit(resource, type_, obj, rv)
        return copy.deepcopy(obj)

    def _remove(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self._objects[resource].pop((namespace, name), None)
        if obj is not None:
            rv = self._next_rv()
            obj["metadata"]["resourceVersion"] = str(rv)
            self._emit(resource, "DELETED", obj, rv)
        return obj

    def get(self, resource: str, name: str, namespace: str = "default") -> dict[str, Any] | None:
        with self._lock:
            obj = self._objects[resource].get((namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def list(
        self, resource: str, namespace: str = "default", selector: str | None = None
    ) -> list[dict[str, Any]]:
        with self._lock:
            return [
                copy.deepcopy(o)
                for (ns, _), o in sorted(self._objects[resource].items())
                if ns == namespace and _selector_matches(selector, o["metadata"].get("labels") or {})
            ]

    def job(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        return self.get("jobs", name, namespace)

    def jobs(self, namespace: str = "default") -> list[dict[str, Any]]:
        return self.list("jobs", namespace)

    def egress_rules(self, pod: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The egress rules a CNI that enforces NetworkPolicies applies to ``pod``: None when no
        policy of its namespace with ``Egress`` in its ``policyTypes`` selects it (egress is open),
        else the rules of all those that do, in name order (policies are additive; ``[]``: shut)."""
        namespace = pod["metadata"].get("namespace", "default")
        labels = pod["metadata"].get("labels") or {}
        rules: list[dict[str, Any]] | None = None
        for policy in self.list("networkpolicies", namespace):
            spec = policy.get("spec") or {}
            selector = spec.get("podSelector") or {}
            if selector.get("matchExpressions"):
                raise NotImplementedError("the fake selects pods by matchLabels only")
            wanted = selector.get("matchLabels") or {}
            if "Egress" in (spec.get("policyTypes") or []) and all(
                labels.get(k) == v for k, v in wanted.items()
            ):
                rules = (rules or []) + list(spec.get("egress") or [])
        return rules

    def secret_value(self, name: str, key: str, namespace: str = "default") -> str | None:
        secret = self.get("secrets", name, namespace)
        if secret is None or key not in (secret.get("data") or {}):
            return None
        return base64.b64decode(secret["data"][key]).decode()

    def write_log(self, job_name: str, text: str, namespace: str = "default") -> None:
        """What the harness printed (served by GET .../pods/{pod}/log)."""
        with self._lock:
            for pod in self._pods_of(namespace, job_name):
                self._logs[(namespace, pod["metadata"]["name"])] = text

    def delete_job(self, name: str, namespace: str = "default") -> None:
        """Someone else deleted the Job (``kubectl delete``, or its TTL), taking its pods along."""
        with self._lock:
            for pod in self._pods_of(namespace, name):
                self._remove("pods", namespace, pod["metadata"]["name"])
            self._remove("jobs", namespace, name)

    def add_fault(
        self,
        method: str,
        resource: str,
        *,
        code: int | None = None,
        reason: str = "",
        message: str = "",
        delay_s: float = 0.0,
        times: int = 1,
    ) -> None:
        """The next ``times`` ``method`` requests on ``resource`` (``POST``, ``jobs``) wait ``delay_s``
        and then fail with a ``code`` Status (or, without a code, are served normally)."""
        with self._lock:
            self._faults.append(_Fault(method, resource, code, reason, message, delay_s, times))

    def clear_faults(self) -> None:
        """Forget the faults not yet used up: the API answers normally again."""
        with self._lock:
            self._faults.clear()

    def _take_fault(self, method: str, resource: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.method == method and fault.resource == resource and fault.times > 0:
                    fault.times -= 1
                    return fault
        return None

    def compact(self) -> None:
        """Forget the event history, as etcd compaction does: older watches get 410 Expired."""
        with self._lock:
            self._compacted_rv = self._next_rv()  # as if another write happened, then compaction
            for events in self._history.values():
                events.clear()

    # ---- the fake job controller --------------------------------------------------------------
    def _create_object(self, resource: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        meta = body.setdefault("metadata", {})
        meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_now_iso(), generation=1)
        body["apiVersion"], body["kind"] = RESOURCES[resource][1], RESOURCES[resource][2]
        if resource == "secrets" and body.get("stringData"):
            data = body.setdefault("data", {})
            for key, value in body.pop("stringData").items():
                data[key] = base64.b64encode(value.encode()).decode()
        if resource != "jobs":
            return self._store(resource, body, "ADDED")
        body["status"] = {}
        created = self._store("jobs", body, "ADDED")
        self._start_job(namespace, meta["name"])
        return created

    def _start_job(self, namespace: str, name: str) -> None:
        job = self._objects["jobs"][(namespace, name)]
        if self.start_pods == "none":
            job["status"] = {"startTime": _now_iso(), "active": 0}
            self._store("jobs", job, "MODIFIED")
            return
        template = job["spec"]["template"]
        uid = job["metadata"]["uid"]
        labels = {
            **(template.get("metadata", {}).get("labels") or {}),
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": name,
            "controller-uid": uid,
            "job-name": name,
        }
        containers = template["spec"].get("containers") or []
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-{secrets.token_hex(3)[:5]}",
                "namespace": namespace,
                "labels": labels,
                "annotations": dict(template.get("metadata", {}).get("annotations") or {}),
                "uid": str(uuid.uuid4()),
                "creationTimestamp": _now_iso(),
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": name,
                        "uid": uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": copy.deepcopy(template["spec"]),
            "status": {
                "phase": "Running",
                "startTime": _now_iso(),
                "conditions": [{"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [
                    {
                        "name": c.get("name", ""),
                        "image": c.get("image", ""),
                        "imageID": "",
                        "ready": True,
                        "restartCount": 0,
                        "state": {"running": {"startedAt": _now_iso()}},
                    }
                    for c in containers
                ],
            },
        }
        if self.start_pods == "pending":
            pod["status"]["phase"] = "Pending"
            for cs in pod["status"]["containerStatuses"]:
                cs.update(ready=False, state={"waiting": {"reason": "ContainerCreating"}})
        self._store("pods", pod, "ADDED")
        ready = 1 if self.start_pods == "running" else 0
        job["status"] = {"startTime": _now_iso(), "active": 1, "ready": ready}
        self._store("jobs", job, "MODIFIED")

    def _pods_of(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        return [
            p
            for (ns, _), p in self._objects["pods"].items()
            if ns == namespace and p["metadata"]["labels"].get("job-name") == job_name
        ]

    def _update_pods(self, namespace: str, job_name: str, mutate: Callable[[dict[str, Any]], None]) -> None:
        for pod in self._pods_of(namespace, job_name):
            mutate(pod)
            self._store("pods", pod, "MODIFIED")

    def _finish(self, namespace: str, name: str, *, ok: bool, reason: str = "", message: str = "") -> None:
        job = self._objects["jobs"][(namespace, name)]
        now = _now_iso()
        status = {k: v for k, v in job["status"].items() if k not in ("active", "ready")}
        if ok:
            status.update(
                succeeded=1,
                completionTime=now,
                conditions=[
                    {
                        "type": "SuccessCriteriaMet",
                        "status": "True",
                        "reason": "CompletionsReached",
                        "message": "Reached expected number of succeeded pods",
                        "lastTransitionTime": now,
                    },
                    {
                        "type": "Complete",
                        "status": "True",
                        "reason": "CompletionsReached",
                        "message": "Reached expected number of succeeded pods",
                        "lastTransitionTime": now,
                    },
                ],
            )
        else:
            status.update(
                failed=1,
                conditions=[
                    {
                        "type": "FailureTarget",
                        "status": "True",
                        "reason": reason,
                        "message": message,
                        "lastTransitionTime": now,
                    },
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": reason,
                        "message": message,
                        "lastTransitionTime": now,
                    },
                ],
            )
        job["status"] = status
        self._store("jobs", job, "MODIFIED")

    def _terminate(self, exit_code: int, reason: str) -> Callable[[dict[str, Any]], None]:
        def mutate(pod: dict[str, Any]) -> None:
            pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
            for cs in pod["status"].get("containerStatuses", []):
                started = (cs["state"].get("running") or {}).get("startedAt")
                cs["ready"] = False
                cs["state"] = {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": reason,
                        "startedAt": started,
                        "finishedAt": _now_iso(),
                    }
                }

        return mutate

    def succeed_job(self, name: str, namespace: str = "default") -> None:
        with self._lock:
            self._update_pods(namespace, name, self._terminate(0, "Completed"))
            self._finish(namespace, name, ok=True)

    def fail_job(
        self, name: str, exit_code: int = 1, reason: str = "Error", namespace: str = "default"
    ) -> None:
        """The harness container ended with ``exit_code``; the Job fails (backoffLimit 0)."""
        with self._lock:
            self._update_pods(namespace, name, self._terminate(exit_code, reason))
            self._finish(
                namespace,
                name,
                ok=False,
                reason="BackoffLimitExceeded",
                message="Job has reached the specified backoff limit",
            )

    def oom_job(self, name: str, namespace: str = "default") -> None:
        self.fail_job(name, exit_code=137, reason="OOMKilled", namespace=namespace)

    def exceed_deadline(self, name: str, namespace: str = "default", keep_pods: bool = False) -> None:
        """activeDeadlineSeconds passed: the job controller deletes the pods and fails the Job."""
        with self._lock:
            if not keep_pods:
                for pod in self._pods_of(namespace, name):
                    self._remove("pods", namespace, pod["metadata"]["name"])
            self._finish(
                namespace,
                name,
                ok=False,
                reason="DeadlineExceeded",
                message="Job was active longer than specified deadline",
            )

    def set_waiting(self, name: str, reason: str, message: str = "", namespace: str = "default") -> None:
        """The Job's pod is stuck before start (ErrImagePull, ImagePullBackOff, InvalidImageName...)."""

        def mutate(pod: dict[str, Any]) -> None:
            pod["status"]["phase"] = "Pending"
            for cs in pod["status"].get("containerStatuses", []):
                cs.update(ready=False, state={"waiting": {"reason": reason, "message": message}})

        with self._lock:
            self._update_pods(namespace, name, mutate)

    def set_unschedulable(self, name: str, since: float | None = None, namespace: str = "default") -> None:
        def mutate(pod: dict[str, Any]) -> None:
            pod["status"] = {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                        "lastTransitionTime": _now_iso(since),
                    }
                ],
            }

        with self._lock:
            self._update_pods(namespace, name, mutate)

    def evict(
        self,
        name: str,
        message: str = "The node was low on resource: memory.",
        namespace: str = "default",
    ) -> None:
        """The kubelet evicted the pod (node pressure, or ``message`` naming a limit it overran) and
        marked it a disruption target; the Job fails."""

        def mutate(pod: dict[str, Any]) -> None:
            pod["status"].update(phase="Failed", reason="Evicted", message=message)
            pod["status"].setdefault("conditions", []).append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "TerminationByKubelet",
                    "message": message,
                    "lastTransitionTime": _now_iso(),
                }
            )

        with self._lock:
            self._update_pods(namespace, name, mutate)
            self._finish(
                namespace,
                name,
                ok=False,
                reason="BackoffLimitExceeded",
                message="Job has reached the specified backoff limit",
            )

    def set_job_age(self, name: str, seconds: float, namespace: str = "default") -> None:
        """Backdate a Job's creation and start (to test 'stuck for too long' rules without sleeping)."""
        with self._lock:
            job = self._objects["jobs"][(namespace, name)]
            at = _now_iso(time.time() - seconds)
            job["metadata"]["creationTimestamp"] = at
            job["status"]["startTime"] = at
            self._store("jobs", job, "MODIFIED")

    def set_running_for(self, name: str, seconds: float, namespace: str = "default") -> None:
        """Backdate a Job's start and its running containers' ``startedAt`` by ``seconds``: its
        harness has been running that long (to test time rules without sleeping)."""
        at = _now_iso(time.time() - seconds)

        def mutate(pod: dict[str, Any]) -> None:
            pod["status"]["startTime"] = at
            for cs in pod["status"].get("containerStatuses", []):
                if cs["state"].get("running") is not None:
                    cs["state"]["running"]["startedAt"] = at

        with self._lock:
            self._update_pods(namespace, name, mutate)
            self.set_job_age(name, seconds, namespace)

    # ---- HTTP ---------------------------------------------------------------------------------
    async def _handle(self, request: Request) -> Response:
        query = dict(request.query_params)
        self.requests.append((request.method, request.url.path, query))
        match = _PATH.match(request.url.path)
        if match is None or match.group(3) not in RESOURCES or RESOURCES[match.group(3)][0] != match.group(1):
            return JSONResponse(
                status_body(404, "NotFound", "the server could not find the requested resource"),
                status_code=404,
            )
        _, namespace, resource, name, log_subresource = match.groups()
        if query.get("watch") in ("true", "1"):
            return await self._serve(request, query, namespace, resource, name, log_subresource)
        with self._lock:
            self.serving += 1
        try:
            fault = self._take_fault(request.method, resource)
            if fault is not None:
                await asyncio.sleep(fault.delay_s)
                if fault.code is not None:
                    group = RESOURCES[resource][3]
                    body = status_body(fault.code, fault.reason, fault.message, kind=resource, group=group)
                    return JSONResponse(body, status_code=fault.code)
            return await self._serve(request, query, namespace, resource, name, log_subresource)
        finally:
            with self._lock:
                self.serving -= 1

    async def _serve(
        self,
        request: Request,
        query: dict[str, str],
        namespace: str,
        resource: str,
        name: str | None,
        log_subresource: str | None,
    ) -> Response:
        _, _, kind, group = RESOURCES[resource]
        plural = f"{resource}.{group}" if group else resource

        def error(code: int, reason: str, message: str) -> JSONResponse:
            return JSONResponse(
                status_body(code, reason, message, name=name or "", kind=resource, group=group),
                status_code=code,
            )

        if name is None and request.method == "GET":
            if query.get("watch") in ("true", "1"):
                return StreamingResponse(
                    self._watch(resource, namespace, query), media_type="application/json"
                )
            with self._lock:
                items = self.list(resource, namespace, query.get("labelSelector"))
                rv = str(self._rv)
            for item in items:  # list items carry no kind/apiVersion
                item.pop("kind", None)
                item.pop("apiVersion", None)
            return JSONResponse(
                {
                    "kind": f"{kind}List",
                    "apiVersion": RESOURCES[resource][1],
                    "metadata": {"resourceVersion": rv},
                    "items": items,
                }
            )
        body: Any = None
        if request.method in ("POST", "PUT", "PATCH"):
            body = json.loads(await request.body() or b"null")
        if request.method in ("POST", "PUT", "PATCH", "DELETE") and resource in READ_ONLY:
            return error(405, "MethodNotAllowed", f"{plural} are read-only in this fake")
        with self._lock:
            if request.method == "POST" and name is None:
                obj_name = ((body or {}).get("metadata") or {}).get("name", "")
                name = obj_name
                if not obj_name or len(obj_name) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(obj_name):
                    return error(
                        422, "Invalid", f'{kind} "{obj_name}" is invalid: metadata.name: Invalid value'
                    )
                if resource == "jobs" and len(obj_name) > 63:
                    return error(
                        422, "Invalid", f'{kind} "{obj_name}" is invalid: must be no more than 63 characters'
                    )
                for key, value in ((body.get("metadata") or {}).get("labels") or {}).items():
                    if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
                        return error(422, "Invalid", f'{kind} "{obj_name}" is invalid: label {key}={value!r}')
                if resource == "jobs" and (invalid := _generated_selector_error(body, obj_name)):
                    return error(422, "Invalid", f'{kind}.batch "{obj_name}" is invalid: {invalid}')
                if (namespace, obj_name) in self._objects[resource]:
                    return error(409, "AlreadyExists", f'{plural} "{obj_name}" already exists')
                return JSONResponse(self._create_object(resource, namespace, body), status_code=201)
            if name is None:
                return error(405, "MethodNotAllowed", "method not allowed on a collection")
            current = self._objects[resource].get((namespace, name))
            if current is None:
                return error(404, "NotFound", f'{plural} "{name}" not found')
            if log_subresource:
                if resource != "pods" or request.method != "GET":
                    return error(404, "NotFound", "the server could not find the requested resource")
                text = self._logs.get((namespace, name), "").encode()
                limit = int(query.get("limitBytes") or 0)
                return Response(text[:limit] if limit else text, media_type="text/plain")
            if request.method == "GET":
                return JSONResponse(copy.deepcopy(current))
            if request.method == "DELETE":
                policy = (
                    query.get("propagationPolicy") or ((body or {}).get("propagationPolicy")) or "Background"
                )
                removed = self._remove(resource, namespace, name)
                uid = removed["metadata"]["uid"]
                if policy != "Orphan":  # what the garbage collector does for dependents
                    for dep in ("pods", "secrets"):
                        for (ns, dep_name), obj in list(self._objects[dep].items()):
                            owners = obj["metadata"].get("ownerReferences") or []
                            if ns == namespace and any(o.get("uid") == uid for o in owners):
                                self._remove(dep, ns, dep_name)
                return JSONResponse(
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Success",
                        "details": {"name": name, "group": group, "kind": resource, "uid": uid},
                    }
                )
            if request.method == "PATCH":
                if not isinstance(body, dict):
                    return error(415, "UnsupportedMediaType", "only merge patches are supported by this fake")
                updated = _merge_patch(current, body)
            else:  # PUT
                sent_rv = ((body or {}).get("metadata") or {}).get("resourceVersion")
                if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
                    return error(
                        409,
                        "Conflict",
                        f'Operation cannot be fulfilled on {plural} "{name}": the object has been modified; '
                        "please apply your changes to the latest version and try again",
                    )
                updated = copy.deepcopy(body)
                updated["status"] = current.get("status", updated.get("status"))
            for field in ("uid", "creationTimestamp", "namespace", "name"):
                updated.setdefault("metadata", {})[field] = current["metadata"][field]
            updated["apiVersion"], updated["kind"] = current["apiVersion"], current["kind"]
            return JSONResponse(self._store(resource, updated, "MODIFIED"))

    async def _watch(self, resource: str, namespace: str, query: dict[str, str]) -> AsyncIterator[bytes]:
        selector = query.get("labelSelector")
        timeout = float(query.get("timeoutSeconds") or 1800)
        since = query.get("resourceVersion") or ""
        loop = asyncio.get_running_loop()
        watcher = _Watcher(resource, namespace, selector, asyncio.Queue(), loop)
        with self._lock:
            if since in ("", "0"):  # "any version": synthetic ADDED for the current state
                initial = [{"type": "ADDED", "object": o} for o in self.list(resource, namespace, selector)]
            elif int(since) < self._compacted_rv:
                message = f"too old resource version: {since} ({self._compacted_rv})"
                initial = [
                    {
                        "type": "ERROR",
                        "object": {
                            "kind": "Status",
                            "apiVersion": "v1",
                            "metadata": {},
                            "status": "Failure",
                            "message": message,
                            "reason": "Expired",
                            "code": 410,
                        },
                    }
                ]
            else:
                initial = [
                    {"type": t, "object": copy.deepcopy(o)}
                    for rv, t, o in self._history[resource]
                    if rv > int(since)
                    and o["metadata"].get("namespace") == namespace
                    and _selector_matches(selector, o["metadata"].get("labels") or {})
                ]
            self._watchers.append(watcher)
        try:
            for event in initial:
                yield (json.dumps(event) + "\n").encode()
                if event["type"] == "ERROR":
                    return
            deadline = loop.time() + timeout
            while (remaining := deadline - loop.time()) > 0:
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), remaining)
                except TimeoutError:
                    return
                if event is None:
                    return
                yield (json.dumps(event) + "\n").encode()
        finally:
            with self._lock:
                self._watchers.remove(watcher)
