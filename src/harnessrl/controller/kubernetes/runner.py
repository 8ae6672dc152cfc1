"""``KubernetesRunner``: one batch/v1 Job per rollout attempt, through the official client.

The only module that imports ``kubernetes``. It is a thin layer: manifests come from ``manifests``,
decisions from ``reconcile.plan``; this module does I/O. Blocking client calls run in threads
(``asyncio.to_thread``); the Job watch runs in its own thread and posts events to the event loop.

The reconcile loop is an informer in miniature: a full list every ``poll_interval_s`` (and after a
watch expires with 410) plus a label-selected watch from the list's resourceVersion in between.
Every pass lists the run's pods (their container states say *why* a Job failed), plans, and
executes. Only the loop creates Jobs, so the concurrency cap is enforced in one place; ``launch``
waits until its Job exists, which is how the cap pushes back on the controller.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from harnessrl.controller.base import Exit, ExitKind, Launch
from harnessrl.controller.kubernetes import manifests
from harnessrl.controller.kubernetes.config import KubernetesRunnerConfig
from harnessrl.controller.kubernetes.job_template import normalize_template
from harnessrl.controller.kubernetes.names import (
    KEY_DIGEST_ANNOTATION,
    MANAGED_BY_LABEL,
    WRITTEN_AT_ANNOTATION,
    attempt_labels,
    label_selector,
    resource_name,
    run_labels,
)
from harnessrl.controller.kubernetes.network_policy import (
    build_baseline_policy,
    build_network_policy,
    run_policy_name,
)
from harnessrl.controller.kubernetes.observed import (
    ObservedJob,
    ObservedPod,
    ObservedSecret,
    attach_pods,
    parse_job,
    parse_pod,
    parse_quantity,
    parse_secret,
)
from harnessrl.controller.kubernetes.reconcile import DesiredAttempt, classify, plan
from harnessrl.errors import ConfigError, Conflict, UpstreamError

log = logging.getLogger(__name__)

# Tries of one delete the API refuses for a while (429, a 5xx): a Job whose delete failed once at
# shutdown (aclose) was left running to its deadline, with no reconcile pass left to sweep it.
DELETE_TRIES = 4
# Reads and replaces of a NetworkPolicy that another runner replaced in between (409 Conflict).
POLICY_REPLACE_TRIES = 3


def _as_stored(spec: dict[str, Any]) -> dict[str, Any]:
    """A NetworkPolicy spec as the API server gives it back: its empty lists (``ingress: []``) left
    out (Go's ``omitempty``). Compared raw, every start found the policy "changed" and replaced it."""
    return {key: value for key, value in spec.items() if value != []}


def _default_api_client() -> k8s.ApiClient:
    """In-cluster service account if there is one, else the user's kubeconfig."""
    from kubernetes import config as kube_config

    configuration = k8s.Configuration()
    try:
        kube_config.load_incluster_config(client_configuration=configuration)
    except kube_config.ConfigException:
        try:
            kube_config.load_kube_config(client_configuration=configuration)
        except Exception as exc:  # the loader raises several unrelated types for "no kubeconfig"
            raise ConfigError(f"no Kubernetes credentials (in-cluster or kubeconfig): {exc}") from exc
    return k8s.ApiClient(configuration)


def _settle(future: asyncio.Future, value: Any = None, exc: BaseException | None = None) -> None:
    if not future.done():
        future.set_exception(exc) if exc is not None else future.set_result(value)


def _status_message(exc: ApiException) -> str:
    """The ``message`` of the API's Status body, if it sent one."""
    try:
        body = json.loads(exc.body) if exc.body else {}
    except ValueError:
        return ""
    return str(body.get("message") or "") if isinstance(body, dict) else ""


# The quota admission's refusal: "exceeded quota: <name>, requested: k=v,..., used: ..., limited: ..."
_QUOTA_LISTS = re.compile(r"requested: ([^\s\"]*), used: ([^\s\"]*), limited: ([^\s\"]*)")


def _quantities(listed: str) -> dict[str, float | None]:
    pairs = (item.split("=", 1) for item in listed.split(",") if "=" in item)
    return {key: parse_quantity(value) for key, value in pairs}


def _never_fits(body: str) -> bool:
    """A quota refusal where one attempt alone asks for more than the quota's hard limit (``requested:
    count/jobs.batch=1 ... limited: count/jobs.batch=0``): no other Job ending will ever free that."""
    match = _QUOTA_LISTS.search(body)
    if match is None:
        return False
    requested, limited = _quantities(match.group(1)), _quantities(match.group(3))
    return any(
        wanted is not None and (hard := limited.get(key)) is not None and wanted > hard
        for key, wanted in requested.items()
    )


def _transient(exc: ApiException) -> bool:
    """An API refusal that passes by itself: throttling, a server error, a ResourceQuota that is
    full now (``403 ... exceeded quota``: other pods end and free it). A quota that forbids the pod
    outright (``must specify limits``), one whose hard limit is below what one attempt asks for, or
    any other 4xx is the config's fault."""
    if exc.status == 429 or exc.status >= 500:
        return True
    body = exc.body.decode("utf-8", "replace") if isinstance(exc.body, bytes) else str(exc.body or "")
    return exc.status == 403 and "exceeded quota" in body and not _never_fits(body)


@dataclass(eq=False)
class _Attempt:
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


class KubernetesRunHandle:
    def __init__(self, runner: KubernetesRunner, attempt: _Attempt) -> None:
        self._runner, self._attempt = runner, attempt

    @property
    def job_name(self) -> str:
        return self._attempt.name

    async def wait(self) -> Exit:
        return await asyncio.shield(self._attempt.done)

    async def kill(self, kind: ExitKind = ExitKind.CANCELLED) -> None:
        await self._runner._kill(self._attempt, kind)


class KubernetesRunner:
    """Runner protocol over Kubernetes Jobs. ``options`` are ``KubernetesRunnerConfig`` fields
    (``namespace``, ``job_template``, ``gateway_url``, ``max_concurrent_jobs``, ``poll_interval_s``...)."""

    # A task's environment reaches a Job as an image reference (``Launch.image``), never as an image
    # mounted on the controller's machine (docs/environments.md).
    image_references = True

    def __init__(
        self,
        api_client: k8s.ApiClient | None = None,
        config: KubernetesRunnerConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        **options: Any,
    ) -> None:
        try:
            self.config = config or KubernetesRunnerConfig(**options)
        except ValidationError as exc:
            raise ConfigError(f"kubernetes runner config: {exc}") from exc
        # Unset, unique to this runner: its Jobs are its own (no other run's runner takes them for
        # its orphans); what a shared run_id gives (one cap, adoption after a restart) it goes without.
        self.run_id = self.config.run_id or f"run-{uuid.uuid4().hex[:12]}"
        self._drawn_run_id = self.config.run_id is None
        self._run_policy_made = False  # this run's allow-list was ensured (aclose may delete it)
        if self.config.run_id is None:
            self.config = self.config.model_copy(update={"run_id": self.run_id})
            log.info("kubernetes.run_id not set: this runner's Jobs are those of run %s", self.run_id)
        cfg = self.config
        try:  # fail on a template the API would reject before any rollout starts
            k8s.V1Job.model_validate(normalize_template(cfg.job_template))
        except ValidationError as exc:
            raise ConfigError(f"kubernetes job_template is not a valid Job/Pod: {exc}") from exc
        self.workspace_dir = cfg.workspace_dir or manifests.template_workspace(
            cfg.job_template, cfg.container_name
        )
        # Labels the Jobs and Secrets this runner creates: controllers sharing a run (and so a label
        # selector) delete only their own orphans, never each other's running Jobs (reconcile.plan).
        self.controller_id = uuid.uuid4().hex[:12]
        self._owns_client = api_client is None
        self.api_client = api_client or _default_api_client()
        self._batch = k8s.BatchV1Api(self.api_client)
        self._core = k8s.CoreV1Api(self.api_client)
        self._net = k8s.NetworkingV1Api(self.api_client)
        self._clock = clock
        self._selector = label_selector(run_labels(self.run_id))
        self._attempts: dict[str, _Attempt] = {}  # launch order = order slots are handed out
        self._jobs: dict[str, ObservedJob] = {}
        self._pods: list[ObservedPod] = []
        self._secrets: dict[str, ObservedSecret] = {}
        self._seq = 0  # orders our creates against list snapshots (see _full_list)
        self._rv: str | None = None
        self._rv_lock = threading.Lock()
        self._rv_ready = threading.Event()
        self._closing = threading.Event()
        self._relist = True
        self._wake: asyncio.Event | None = None
        self._start_lock = asyncio.Lock()
        self._started_at: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._watch: k8s_watch.Watch | None = None
        self._watch_thread: threading.Thread | None = None
        self._finishing: set[asyncio.Task] = set()  # saving logs of ended attempts
        # Jobs of ended attempts whose log is being saved: deleted (if they must be) only after that,
        # since deleting a Job takes its pods, and their logs, along.
        self._saving: set[str] = set()
        self._creating: set[asyncio.Task] = set()  # Secret + Job creates in flight (aclose waits)

    @property
    def gateway_url(self) -> str:
        """The gateway root as harness pods reach it (what placeholders should be rendered with)."""
        return self.config.gateway_url

    # ---- API calls (blocking client, run in threads; raw JSON, so newer servers' fields survive) ----
    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bytes:
        def call() -> bytes:
            try:
                resp = fn(
                    *args, _preload_content=False, _request_timeout=self.config.request_timeout_s, **kwargs
                )
            except urllib3.exceptions.HTTPError as exc:  # refused, reset, timed out: not an API answer
                raise UpstreamError(f"Kubernetes API at {self.api_client.configuration.host}: {exc}") from exc
            return resp.data or b""

        return await asyncio.to_thread(call)

    async def _api(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        return json.loads(await self._call(fn, *args, **kwargs) or b"{}")

    async def _delete(self, fn: Callable[..., Any], name: str) -> None:
        """Delete ``name`` (gone already is fine); a refusal that passes by itself (429, a 5xx) is
        tried again, ``DELETE_TRIES`` times in all, with a short back-off."""
        for tries in range(1, DELETE_TRIES + 1):
            try:
                await self._api(fn, name, self.config.namespace, propagation_policy="Background")
                return
            except ApiException as exc:
                if exc.status == 404:
                    return
                if not _transient(exc) or tries == DELETE_TRIES:
                    raise
            await asyncio.sleep(min(self.config.poll_interval_s, 0.25 * 2**tries))

    # ---- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Ensure the NetworkPolicy, list what exists, start the watch and the loop. Idempotent;
        ``launch`` calls it."""
        async with self._start_lock:
            if self._task is not None:
                return
            self._loop = asyncio.get_running_loop()
            self._wake = asyncio.Event()
            if self.config.network_policy is not None:
                await self._ensure_network_policy()
            else:
                log.warning(
                    "kubernetes runner: no network_policy configured; harness egress is not restricted"
                )
            try:
                await self._full_list()
            except ApiException as exc:
                raise self._list_error(exc) from exc
            self._started_at = self._clock()
            self._watch_thread = threading.Thread(
                target=self._watch_jobs, name="harnessrl-k8s-watch", daemon=True
            )
            self._watch_thread.start()
            self._task = asyncio.create_task(self._reconcile_loop(), name="harnessrl-k8s-reconcile")

    def _list_error(self, exc: ApiException) -> ConfigError | UpstreamError:
        """A first list the API refused, as a clear error (it reached ``launch`` as a bare
        ``ApiException``): throttled or a server error (``UpstreamError``, the next launch tries
        again), else the config's (no RBAC to list jobs, secrets or pods; ``ConfigError``)."""
        where = f"in namespace {self.config.namespace!r}"
        what = f"{exc.status} {exc.reason} {_status_message(exc)}".strip()
        if _transient(exc):
            return UpstreamError(
                f"Kubernetes API could not list the run's Jobs, Secrets and pods {where}: {what}"
            )
        return ConfigError(
            f"cannot list the run's Jobs, Secrets and pods {where}: {what} (the service account needs "
            "jobs list/watch, secrets list and pods list there: docs/kubernetes.md, RBAC)"
        )

    async def _ensure_network_policy(self) -> None:
        """The namespace's deny-all baseline, then this run's allow-list (``network_policy``): in
        that order, so no pod of this run is ever selected by an allow-list alone."""
        np = self.config.network_policy
        assert np is not None
        await self._ensure_policy(build_baseline_policy(self.config.namespace, name=np.name))
        labels = run_labels(self.run_id)
        labels.pop(MANAGED_BY_LABEL)  # build_network_policy adds it
        await self._ensure_policy(
            build_network_policy(
                self.config.namespace,
                gateway_port=np.gateway_port,
                gateway_pod_labels=np.gateway_pod_labels,
                gateway_namespace=np.gateway_namespace,
                gateway_cidr=np.gateway_cidr,
                allow_dns=np.allow_dns,
                dns_namespace=np.dns_namespace,
                dns_pod_labels=np.dns_pod_labels,
                name=run_policy_name(np.name, self.run_id),
                pod_labels=labels,
            )
        )
        self._run_policy_made = True

    async def _ensure_policy(self, desired: dict[str, Any]) -> None:
        """Create ``desired``, or replace the policy of its name if its spec differs. Every runner of
        the namespace ensures the same baseline at its start, so a replace may meet another's (409
        Conflict): the policy is read and compared again, a few times."""
        ns, name = self.config.namespace, desired["metadata"]["name"]
        try:
            try:
                await self._api(self._net.create_namespaced_network_policy, ns, desired)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
            for tries in range(1, POLICY_REPLACE_TRIES + 1):
                current = await self._api(self._net.read_namespaced_network_policy, name, ns)
                if _as_stored(current.get("spec") or {}) == _as_stored(desired["spec"]):
                    return
                replacement = copy.deepcopy(desired)  # converge to this config's allow-list
                replacement["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                try:
                    await self._api(self._net.replace_namespaced_network_policy, name, ns, replacement)
                    return
                except ApiException as exc:
                    if exc.status != 409 or tries == POLICY_REPLACE_TRIES:
                        raise
        except ApiException as exc:
            raise ConfigError(f"cannot ensure NetworkPolicy {name!r}: {exc.status} {exc.reason}") from exc

    async def _delete_run_policy(self) -> None:
        """Delete this run's allow-list when this runner drew its run id: no other controller can
        share that run, and every runner start would otherwise leave one more policy behind."""
        np = self.config.network_policy
        if np is None or not self._drawn_run_id or not self._run_policy_made:
            return
        try:
            await self._delete(
                self._net.delete_namespaced_network_policy, run_policy_name(np.name, self.run_id)
            )
        except Exception as exc:  # deliberate: it selects no pod any more; only clutter is left
            log.warning("could not delete the run's NetworkPolicy: %s", exc)

    async def __aenter__(self) -> KubernetesRunner:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def forget(self, handle: Any) -> None:
        """Nothing to drop: an attempt leaves ``_attempts`` by itself when its Job ends."""

    async def aclose(self, *, kill_running: bool = True) -> None:
        """Stop the loop and the watch; kill every unfinished attempt (``kill_running=False`` leaves
        the Jobs running for a successor controller to adopt)."""
        if self._closing.is_set():
            return
        self._closing.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._creating:  # a create still in flight lands after any kill: let it, then kill
            await asyncio.wait(set(self._creating), timeout=4 * self.config.request_timeout_s)
        deadline = time.monotonic() + 10
        while (
            self._watch_thread is not None and self._watch_thread.is_alive() and time.monotonic() < deadline
        ):
            # Watch.stop() shuts the socket down so the blocked read returns; repeated because a stop
            # that lands while the request is still being sent is forgotten when stream() begins.
            if self._watch is not None:
                self._watch.stop()
            await asyncio.sleep(0.02)
        if self._finishing:
            await asyncio.wait(set(self._finishing), timeout=self.config.request_timeout_s)
        pending = list(self._attempts.values())
        if kill_running:
            await asyncio.gather(
                *(self._kill(a, ExitKind.CANCELLED) for a in pending), return_exceptions=True
            )
            await self._delete_run_policy()
        for attempt in pending:
            _settle(attempt.created)
            _settle(attempt.done, Exit(ExitKind.INFRA, None, "runner closed before the attempt ended"))
        if self._owns_client:
            self.api_client.close()

    # ---- Runner protocol ----------------------------------------------------------------------
    async def launch(self, launch: Launch) -> KubernetesRunHandle:
        if self._closing.is_set():
            raise Conflict("the kubernetes runner is closed")
        await self.start()
        cfg = self.config
        name = resource_name(launch.rollout_id, launch.attempt, scope=self.run_id, prefix=cfg.name_prefix)
        if name in self._attempts:
            raise Conflict(f"rollout {launch.rollout_id!r} attempt {launch.attempt} is already running")
        labels = attempt_labels(self.run_id, launch.rollout_id, launch.attempt, controller=self.controller_id)
        job = manifests.build_job_manifest(
            cfg.job_template,
            launch,
            namespace=cfg.namespace,
            job_name=name,
            secret_name=name,
            gateway_url=cfg.gateway_url,
            labels=labels,
            active_deadline_s=launch.timeout_s + cfg.startup_allowance_s,
            ttl_after_finished_s=cfg.ttl_after_finished_s,
            image=cfg.image,
            container_name=cfg.container_name,
            workspace_dir=self.workspace_dir,
            pod_security=cfg.pod_security,
            harness_image=cfg.harness_image,
            harness_paths=cfg.harness_paths,
            ephemeral_storage_limit=cfg.ephemeral_storage_limit,
        )
        secret = manifests.build_secret_manifest(
            launch,
            namespace=cfg.namespace,
            name=name,
            labels=labels,
            gateway_url=cfg.gateway_url,
            workspace_dir=self.workspace_dir,
        )
        try:
            k8s.V1Job.model_validate(job)
        except ValidationError as exc:
            raise ConfigError(f"rendered Job {name} is invalid: {exc}") from exc
        loop = asyncio.get_running_loop()
        attempt = _Attempt(name, launch, job, secret, loop.create_future(), loop.create_future())
        self._attempts[name] = attempt
        self._kick()
        try:
            await asyncio.shield(attempt.created)  # waits for a slot under max_concurrent_jobs
        except asyncio.CancelledError:
            await asyncio.shield(self._kill(attempt, ExitKind.CANCELLED))
            raise
        except BaseException:
            self._attempts.pop(name, None)
            raise
        return KubernetesRunHandle(self, attempt)

    async def _kill(self, attempt: _Attempt, kind: ExitKind) -> None:
        if attempt.done.done():
            return
        _settle(attempt.done, Exit(kind, None, f"killed by harnessrl ({kind.value})"))
        _settle(attempt.created)
        self._attempts.pop(attempt.name, None)
        try:
            await self._delete(self._batch.delete_namespaced_job, attempt.name)
        finally:  # the Secret holds the key: deleted even if the Job's delete failed
            await self._delete(self._core.delete_namespaced_secret, attempt.name)

    # ---- reconcile ----------------------------------------------------------------------------
    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _reconcile_loop(self) -> None:
        assert self._wake is not None
        next_list = time.monotonic() + self.config.poll_interval_s
        failing_since: float | None = None  # time.monotonic() of the first of the failed passes in a row
        while not self._closing.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, next_list - time.monotonic()))
            self._wake.clear()
            try:
                if self._relist or time.monotonic() >= next_list:
                    await self._full_list()
                    next_list = time.monotonic() + self.config.poll_interval_s
                else:
                    await self._list_pods()
                await self._reconcile_once()
                failing_since = None
            except Exception as exc:  # deliberate: one failed pass must not stop the loop
                log.warning("kubernetes reconcile pass failed: %s", exc)
                self._relist = True
                failing_since = failing_since or time.monotonic()
                self._fail_waiting_launches(exc, time.monotonic() - failing_since)
                await asyncio.sleep(min(1.0, self.config.poll_interval_s))

    def _fail_waiting_launches(self, exc: Exception, failing_for: float) -> None:
        """After ``stuck_pending_s`` of failed passes, fail every launch still waiting for its Job
        (an ``UpstreamError``: INFRA, retried by the controller). Only a pass creates Jobs, so an API
        that refuses the lists (every request a 5xx, credentials expired: 401) left them waiting
        forever, and the controller's slots with them. Attempts whose Jobs exist run on: their
        outcome is read when the API answers again."""
        if failing_for < self.config.stuck_pending_s:
            return
        error = UpstreamError(
            f"Kubernetes API failed every reconcile pass for {failing_for:.0f}s (stuck_pending_s); "
            f"the Job was never created: {exc}"
        )
        for attempt in [a for a in self._attempts.values() if not a.is_created]:
            # A create still in flight that lands after this deletes its Job (_create: done is set).
            self._attempts.pop(attempt.name, None)
            _settle(attempt.created, exc=error)
            _settle(attempt.done, Exit(ExitKind.INFRA, None, str(error)))

    async def _list_pods(self) -> None:
        pods = await self._api(
            self._core.list_namespaced_pod, self.config.namespace, label_selector=self._selector
        )
        self._pods = [parse_pod(p) for p in pods.get("items") or ()]

    async def _full_list(self) -> None:
        self._seq += 1
        list_seq = self._seq
        ns, sel = self.config.namespace, self._selector
        jobs = await self._api(self._batch.list_namespaced_job, ns, label_selector=sel)
        secrets = await self._api(self._core.list_namespaced_secret, ns, label_selector=sel)
        await self._list_pods()
        self._jobs = {j["metadata"]["name"]: parse_job(j) for j in jobs.get("items") or ()}
        self._secrets = {s["metadata"]["name"]: parse_secret(s) for s in secrets.get("items") or ()}
        for attempt in self._attempts.values():  # created before this list began, yet absent: gone
            if attempt.is_created and attempt.created_seq < list_seq and attempt.name not in self._jobs:
                attempt.vanished = True
        with self._rv_lock:
            self._rv = (jobs.get("metadata") or {}).get("resourceVersion")
        self._relist = False
        self._rv_ready.set()

    @staticmethod
    def _seen_running(attempt: _Attempt, job: ObservedJob | None) -> float | None:
        """Record when the attempt's harness was first seen running: its pods may be gone by the
        time the Job fails (a deadline deletes them), and only a harness that ran can time out."""
        started = job.harness_started_at() if job is not None else None
        if started is not None and (
            attempt.harness_started_at is None or started < attempt.harness_started_at
        ):
            attempt.harness_started_at = started
        return attempt.harness_started_at

    def _desired(self, attempt: _Attempt, job: ObservedJob | None) -> DesiredAttempt:
        return DesiredAttempt(
            attempt.name,
            attempt.launch.rollout_id,
            attempt.launch.attempt,
            created=attempt.is_created,
            vanished=attempt.vanished,
            harness_started_at=self._seen_running(attempt, job),
            timeout_s=attempt.launch.timeout_s,
        )

    async def _reconcile_once(self) -> None:
        for attempt in list(self._attempts.values()):  # before plan() would adopt another's Job
            job_seen = self._jobs.get(attempt.name)
            if (
                not attempt.is_created
                and job_seen is not None
                and self._foreign(attempt, job_seen.annotations)
            ):
                self._refuse_foreign(attempt)
        observed = attach_pods(self._jobs, self._pods)
        desired = [self._desired(a, observed.get(a.name)) for a in self._attempts.values()]
        now = self._clock()
        assert self._started_at is not None
        actions = plan(
            desired,
            observed,
            max_concurrent=self.config.max_concurrent_jobs,
            now=now,
            stuck_pending_s=self.config.stuck_pending_s,
            delete_orphans=now - self._started_at >= self.config.orphan_grace_s,
            observed_secrets=self._secrets,
            orphan_secret_grace_s=self._secret_grace_s(),
            owner=self.controller_id,
        )
        for name in actions.adopted:
            self._mark_created(self._attempts[name])
        # An ended attempt whose Job still runs (a stuck pod, a sidecar that outlives the harness) is
        # deleted by its _finish, once the harness's log is saved.
        stop_after_log = set(actions.completed) & set(actions.delete)
        for name, exit_ in actions.completed.items():
            self._resolve(self._attempts[name], exit_, delete_job=name in stop_after_log)
        ready = time.monotonic()
        creates = [
            self._start_create(a) for d in actions.create if (a := self._attempts[d.name]).retry_at <= ready
        ]
        deletes = [
            self._delete(self._batch.delete_namespaced_job, n)
            for n in actions.delete
            if n not in stop_after_log and n not in self._saving
        ]
        deletes += [self._delete(self._core.delete_namespaced_secret, n) for n in actions.delete_secrets]
        deletes += [self._delete(self._core.delete_namespaced_secret, n) for n in actions.completed]
        # Shielded: cancelling this pass (aclose) must not abandon a create whose request is already
        # on its way; aclose waits for it instead, so no Job lands after the kill.
        results = await asyncio.gather(
            *(asyncio.shield(t) for t in creates), *deletes, return_exceptions=True
        )
        for result in results:
            if isinstance(result, Exception):
                log.warning("kubernetes reconcile action failed: %s", result)

    @staticmethod
    def _foreign(attempt: _Attempt, annotations: Any) -> bool:
        """A Job of the attempt's name made for another rollout key: another store's rollout of the
        same id under the same run id (a run started afresh, a second deployment). Jobs without the
        digest (older harnessrl) are taken as the attempt's, as before."""
        theirs = (annotations or {}).get(KEY_DIGEST_ANNOTATION)
        return theirs is not None and theirs != attempt.job["metadata"]["annotations"][KEY_DIGEST_ANNOTATION]

    def _refuse_foreign(self, attempt: _Attempt) -> None:
        """Fail the launch with a ``ConfigError``: adopting the Job would record another rollout's
        outcome and log as this attempt's (and writing the Secret would hand that Job this key)."""
        self._attempts.pop(attempt.name, None)
        error = ConfigError(
            f"Job {attempt.name} in namespace {self.config.namespace!r} was made for another rollout "
            f"with the id {attempt.launch.rollout_id!r} (attempt {attempt.launch.attempt}) and another "
            f"key: another store's run uses kubernetes.run_id {self.run_id!r} in this namespace "
            "too; give each run its own kubernetes.run_id"
        )
        _settle(attempt.created, exc=error)
        _settle(attempt.done, Exit(ExitKind.INFRA, None, str(error)))

    def _secret_grace_s(self) -> float:
        """How old (since last written) a Secret with no Job must be before any runner of the run
        sweeps it: ``orphan_grace_s``, but never less than a peer's create can take between writing
        its Secret and its Job showing in our lists (a back-off, the two requests, our list)."""
        cfg = self.config
        return max(cfg.orphan_grace_s, cfg.poll_interval_s + 4 * cfg.request_timeout_s)

    def _mark_created(self, attempt: _Attempt) -> None:
        self._seq += 1
        attempt.is_created, attempt.created_seq = True, self._seq
        _settle(attempt.created)

    def _resolve(self, attempt: _Attempt, exit_: Exit, *, delete_job: bool = False) -> None:
        """The attempt ended: save its pod's log, then (``delete_job``: its Job still runs) delete
        the Job, then let ``wait`` return."""
        self._attempts.pop(attempt.name, None)
        _settle(attempt.created)
        pods = [p for p in self._pods if p.job_name == attempt.name]
        pod = max(pods, key=lambda p: (p.created_at or 0.0, p.name), default=None)
        self._saving.add(attempt.name)
        task = asyncio.create_task(self._finish(attempt, exit_, pod, delete_job=delete_job))
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def _finish(
        self, attempt: _Attempt, exit_: Exit, pod: ObservedPod | None, *, delete_job: bool = False
    ) -> None:
        try:
            if pod is not None and not attempt.done.done():
                try:
                    await self._save_log(attempt, pod)
                except Exception as exc:  # deliberate: a missing log never changes the outcome
                    log.warning("could not save the log of %s: %s", pod.name, exc)
            if delete_job:
                try:
                    await self._delete(self._batch.delete_namespaced_job, attempt.name)
                except Exception as exc:  # deliberate: the orphan sweep or its deadline ends it later
                    log.warning("could not delete the Job %s: %s", attempt.name, exc)
        finally:
            self._saving.discard(attempt.name)
            _settle(attempt.done, exit_)

    async def _save_log(self, attempt: _Attempt, pod: ObservedPod) -> None:
        """The end of the harness container's log (its last ``max_log_bytes``) as ``stdout.log``
        (Kubernetes merges stdout and stderr). The API's ``limitBytes`` keeps a log's head: a long
        log lost its end, where a harness prints its answer and a failing one says why. The log is
        read as a stream, holding at most twice ``max_log_bytes`` at a time."""
        limit = self.config.max_log_bytes

        def read_tail() -> bytes:
            try:
                resp = self._core.read_namespaced_pod_log(
                    pod.name,
                    self.config.namespace,
                    container=pod.harness_container,
                    _preload_content=False,
                    _request_timeout=self.config.request_timeout_s,
                )
                tail = bytearray()
                try:
                    for chunk in resp.stream(1 << 16):
                        tail += chunk
                        if len(tail) > 2 * limit:
                            del tail[:-limit]
                finally:
                    resp.release_conn()
            except urllib3.exceptions.HTTPError as exc:  # refused, reset, timed out: not an API answer
                raise UpstreamError(f"Kubernetes API at {self.api_client.configuration.host}: {exc}") from exc
            return bytes(tail[-limit:])

        data = await asyncio.to_thread(read_tail)
        path = attempt.launch.log_dir / "stdout.log"

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)

        await asyncio.to_thread(write)

    async def _foreign_job_exists(self, attempt: _Attempt) -> bool:
        try:
            job = await self._api(self._batch.read_namespaced_job, attempt.name, self.config.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return self._foreign(attempt, (job.get("metadata") or {}).get("annotations"))

    def _start_create(self, attempt: _Attempt) -> asyncio.Task[None]:
        task = asyncio.create_task(self._create(attempt), name=f"harnessrl-k8s-create-{attempt.name}")
        self._creating.add(task)
        task.add_done_callback(self._creating.discard)
        return task

    async def _create(self, attempt: _Attempt) -> None:
        ns, name = self.config.namespace, attempt.name
        # Stamped on every try: the grace that keeps other runners from sweeping it counts from here.
        attempt.secret["metadata"]["annotations"][WRITTEN_AT_ANNOTATION] = f"{self._clock():.3f}"
        adopting = False
        wrote_secret = False  # the Secret under this name is this attempt's (created or rewritten)
        try:
            try:
                await self._api(self._core.create_namespaced_secret, ns, attempt.secret)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                # Ours to rewrite unless another store's Job of this name uses it: its pod may not
                # have started yet, and would start with this attempt's key and task.
                if await self._foreign_job_exists(attempt):
                    self._refuse_foreign(attempt)
                    return
                await self._api(self._core.replace_namespaced_secret, name, ns, attempt.secret)
            wrote_secret = True
            try:
                job = await self._api(self._batch.create_namespaced_job, ns, attempt.job)
            except ApiException as exc:
                if exc.status != 409:  # 409: a predecessor created it; adopt it
                    raise
                adopting = True
                job = await self._api(self._batch.read_namespaced_job, name, ns)
                if self._foreign(attempt, (job.get("metadata") or {}).get("annotations")):
                    self._refuse_foreign(attempt)
                    with contextlib.suppress(Exception):  # ours, under its name: its own was gone
                        await self._delete(self._core.delete_namespaced_secret, name)
                    return
        except ApiException as exc:
            if exc.status == 429 or exc.status >= 500:
                detail = f"{exc.status} {exc.reason} {_status_message(exc)}".strip()
                if await self._erring_too_long(attempt, detail, wrote_secret=wrote_secret):
                    return
            else:
                attempt.erroring_since = None
            # A 404 on reading the Job a 409 said exists: it was being deleted (a predecessor's, killed
            # or swept) and is gone now, so the name is free again: create it on a later pass.
            if _transient(exc) or (adopting and exc.status == 404):
                self._back_off(attempt)  # the attempt keeps waiting, like one without a free slot
                raise  # logged; a pass after the back-off tries again
            error = ConfigError(
                f"Kubernetes rejected {name}: {exc.status} {exc.reason} {exc.body or ''}".strip()
            )
            await self._fail_create(attempt, error, wrote_secret=wrote_secret)
            return
        except UpstreamError as exc:  # no answer at all (timed out, refused, reset): as a 5xx
            if await self._erring_too_long(attempt, str(exc), wrote_secret=wrote_secret):
                return
            self._back_off(attempt)
            raise
        attempt.create_failures = 0
        attempt.erroring_since = None
        self._jobs.setdefault(name, parse_job(job))
        owner = {"metadata": {"ownerReferences": [manifests.owner_reference(job)]}}
        try:  # so the garbage collector removes the Secret with the Job (TTL) if we never do
            await self._api(
                self._core.patch_namespaced_secret,
                name,
                ns,
                owner,
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            log.warning("could not set the owner of Secret %s: %s", name, exc.reason)
        self._mark_created(attempt)
        if attempt.done.done():  # killed while the create was in flight: do not leave it running
            await self._delete(self._batch.delete_namespaced_job, name)
            await self._delete(self._core.delete_namespaced_secret, name)

    async def _erring_too_long(self, attempt: _Attempt, detail: str, *, wrote_secret: bool) -> bool:
        """Count one create the API erred on (429, a 5xx, no answer in ``request_timeout_s``); once
        they have gone on in a row for ``stuck_pending_s``, fail the launch and say so (True). An API
        that only errs (a failing admission webhook answers 500 to every create, a slow one lets
        every create time out) left the launch waiting forever: an infrastructure failure, like a
        pod stuck pulling its image this long."""
        now = time.monotonic()
        attempt.erroring_since = attempt.erroring_since or now
        if now - attempt.erroring_since < self.config.stuck_pending_s:
            return False
        error = UpstreamError(
            f"Kubernetes API refused to create {attempt.name} for {now - attempt.erroring_since:.0f}s "
            f"(stuck_pending_s): {detail}"
        )
        await self._fail_create(attempt, error, wrote_secret=wrote_secret)
        return True

    def _back_off(self, attempt: _Attempt) -> None:
        """The next create of ``attempt`` waits a little longer (up to ``poll_interval_s``)."""
        attempt.create_failures += 1
        backoff = min(self.config.poll_interval_s, 0.25 * 2**attempt.create_failures)
        attempt.retry_at = time.monotonic() + backoff

    async def _fail_create(self, attempt: _Attempt, error: Exception, *, wrote_secret: bool) -> None:
        """The create is given up: ``launch()`` raises ``error``. A Job a 5xx may have created after
        all carries this runner's id and no attempt wants it: the orphan sweep deletes it."""
        self._attempts.pop(attempt.name, None)
        if wrote_secret:  # it has no use now (one we did not write may be another store's Job's)
            with contextlib.suppress(Exception):
                await self._delete(self._core.delete_namespaced_secret, attempt.name)
        _settle(attempt.created, exc=error)  # launch() raises it
        _settle(attempt.done, Exit(ExitKind.INFRA, None, str(error)))

    # ---- watch (own thread) -------------------------------------------------------------------
    def _on_event(self, type_: str, obj: dict[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        if type_ == "DELETED":
            last = self._jobs.pop(name, None) or parse_job(obj)
            attempt = self._attempts.get(name)
            if attempt is not None and attempt.is_created:
                pods = [p for p in self._pods if p.job_name == name]
                job = attach_pods({name: last}, pods)[name]
                exit_ = classify(
                    job,
                    now=self._clock(),
                    stuck_pending_s=self.config.stuck_pending_s,
                    harness_started_at=self._seen_running(attempt, job),
                    timeout_s=attempt.launch.timeout_s,
                )
                if exit_ is not None:
                    self._resolve(attempt, exit_)
                else:
                    attempt.vanished = True
        else:
            self._jobs[name] = parse_job(obj)
        self._kick()

    def _request_relist(self) -> None:
        self._relist = True
        self._kick()

    def _watch_jobs(self) -> None:
        assert self._loop is not None
        backoff = 0.1
        while not self._closing.is_set():
            with self._rv_lock:
                rv = self._rv
            if rv is None:
                self._rv_ready.wait(0.5)
                continue
            self._watch = watch = k8s_watch.Watch()
            if self._closing.is_set():
                break
            try:
                for event in watch.stream(
                    self._batch.list_namespaced_job,
                    self.config.namespace,
                    label_selector=self._selector,
                    resource_version=rv,
                    timeout_seconds=self.config.watch_timeout_s,
                    allow_watch_bookmarks=True,
                    _request_timeout=self.config.watch_timeout_s + 30,
                ):
                    obj = event.get("raw_object") or {}
                    new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if new_rv:
                        with self._rv_lock:
                            self._rv = new_rv
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        self._loop.call_soon_threadsafe(self._on_event, event["type"], obj)
                    if self._closing.is_set():
                        break
                backoff = 0.1
            except ApiException as exc:
                if exc.status == 410:  # history compacted: relist, then watch from the list's version
                    with self._rv_lock:
                        self._rv = None
                    self._rv_ready.clear()
                    self._loop.call_soon_threadsafe(self._request_relist)
                    continue
                log.warning("kubernetes job watch failed: %s %s", exc.status, exc.reason)
                self._closing.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception as exc:  # connection reset, shutdown during close
                if self._closing.is_set():
                    break
                log.warning("kubernetes job watch broke: %s", exc)
                self._closing.wait(backoff)
                backoff = min(backoff * 2, 5.0)
