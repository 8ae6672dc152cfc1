"""``KubernetesRunner``: one batch/v1 Job per rollout attempt, through the official client.

The runner's public face: it renders an attempt's manifests and waits for its Job, kills attempts,
and opens and closes the rest, each part a module of its own: ``reconcile_loop`` (lists, plans with
``reconcile.plan``, executes), ``job_creator`` (an attempt's Secret and Job), ``job_watch`` (the
watch thread), ``endings`` (an ended attempt's log and Job), ``attempts`` (what the runner wants and
saw), ``policy_keeper`` (the NetworkPolicies), ``api`` and ``api_errors`` (the client made async,
and which refusals pass). ``launch`` waits until its Job exists, and only the reconcile loop creates
Jobs: that is how ``max_concurrent_jobs`` pushes back on the controller.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from harnessrl.controller.base import Exit, ExitKind, Launch
from harnessrl.controller.kubernetes import manifests
from harnessrl.controller.kubernetes.api import KubeApi, default_api_client
from harnessrl.controller.kubernetes.api_errors import list_error
from harnessrl.controller.kubernetes.attempts import Attempt, RunBook, settle
from harnessrl.controller.kubernetes.config import KubernetesRunnerConfig
from harnessrl.controller.kubernetes.job_creator import render_attempt
from harnessrl.controller.kubernetes.job_template import normalize_template
from harnessrl.controller.kubernetes.names import label_selector, resource_name, run_labels
from harnessrl.controller.kubernetes.policy_keeper import NetworkPolicyKeeper
from harnessrl.controller.kubernetes.reconcile_loop import Reconciler
from harnessrl.errors import ConfigError, Conflict

log = logging.getLogger(__name__)


class KubernetesRunHandle:
    def __init__(self, runner: KubernetesRunner, attempt: Attempt) -> None:
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
        drawn_run_id = self.config.run_id is None
        if drawn_run_id:
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
        self.api_client = api_client or default_api_client()
        self._api = KubeApi(self.api_client, cfg)
        self._book = RunBook()
        self._policies = NetworkPolicyKeeper(self._api, self.run_id, owns_run=drawn_run_id)
        self._closing = threading.Event()
        self._reconciler = Reconciler(
            self._api,
            self._book,
            selector=label_selector(run_labels(self.run_id)),
            controller_id=self.controller_id,
            run_id=self.run_id,
            clock=clock,
            closing=self._closing,
        )
        self._start_lock = asyncio.Lock()

    @property
    def gateway_url(self) -> str:
        """The gateway root as harness pods reach it (what placeholders should be rendered with)."""
        return self.config.gateway_url

    # ---- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Ensure the NetworkPolicy, list what exists, start the watch and the loop. Idempotent;
        ``launch`` calls it."""
        async with self._start_lock:
            if self._reconciler.running:
                return
            if self.config.network_policy is not None:
                await self._policies.ensure()
            else:
                log.warning(
                    "kubernetes runner: no network_policy configured; harness egress is not restricted"
                )
            try:
                await self._reconciler.open()
            except ApiException as exc:
                raise list_error(exc, self.config.namespace) from exc

    async def __aenter__(self) -> KubernetesRunner:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def forget(self, handle: Any) -> None:
        """Nothing to drop: an attempt leaves the book by itself when its Job ends."""

    async def aclose(self, *, kill_running: bool = True) -> None:
        """Stop the loop and the watch; kill every unfinished attempt (``kill_running=False`` leaves
        the Jobs running for a successor controller to adopt)."""
        if self._closing.is_set():
            return
        self._closing.set()
        await self._reconciler.close()
        pending = list(self._book.attempts.values())
        if kill_running:
            await asyncio.gather(
                *(self._kill(a, ExitKind.CANCELLED) for a in pending), return_exceptions=True
            )
            await self._policies.delete_run_policy()
        for attempt in pending:
            settle(attempt.created)
            settle(attempt.done, Exit(ExitKind.INFRA, None, "runner closed before the attempt ended"))
        if self._owns_client:
            self.api_client.close()

    # ---- Runner protocol ----------------------------------------------------------------------
    async def launch(self, launch: Launch) -> KubernetesRunHandle:
        if self._closing.is_set():
            raise Conflict("the kubernetes runner is closed")
        await self.start()
        cfg = self.config
        name = resource_name(launch.rollout_id, launch.attempt, scope=self.run_id, prefix=cfg.name_prefix)
        if name in self._book.attempts:
            raise Conflict(f"rollout {launch.rollout_id!r} attempt {launch.attempt} is already running")
        job, secret = render_attempt(
            self._api,
            launch,
            name,
            run_id=self.run_id,
            controller_id=self.controller_id,
            workspace_dir=self.workspace_dir,
        )
        try:
            k8s.V1Job.model_validate(job)
        except ValidationError as exc:
            raise ConfigError(f"rendered Job {name} is invalid: {exc}") from exc
        loop = asyncio.get_running_loop()
        attempt = Attempt(name, launch, job, secret, loop.create_future(), loop.create_future())
        self._book.attempts[name] = attempt
        self._reconciler.kick()
        try:
            await asyncio.shield(attempt.created)  # waits for a slot under max_concurrent_jobs
        except asyncio.CancelledError:
            await asyncio.shield(self._kill(attempt, ExitKind.CANCELLED))
            raise
        except BaseException:
            self._book.attempts.pop(name, None)
            raise
        return KubernetesRunHandle(self, attempt)

    async def _kill(self, attempt: Attempt, kind: ExitKind) -> None:
        if attempt.done.done():
            return
        settle(attempt.done, Exit(kind, None, f"killed by harnessrl ({kind.value})"))
        settle(attempt.created)
        self._book.attempts.pop(attempt.name, None)
        try:
            await self._api.delete_job(attempt.name)
        finally:  # the Secret holds the key: deleted even if the Job's delete failed
            await self._api.delete_secret(attempt.name)
