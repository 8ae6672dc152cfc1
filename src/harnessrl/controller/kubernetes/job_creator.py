"""An attempt's Secret and Job: rendered from the template, created, adopted or refused, retried.

The Secret (the rollout's key and task) is written first, then the Job that mounts it. A ``409`` on
either means a predecessor (a restarted controller, an earlier pass whose answer was lost) made it:
the Job is adopted unless its key digest says it was made for another store's rollout. Refusals
that pass by themselves back off and are tried again by a later reconcile pass, until they have
gone on for ``stuck_pending_s``; any other refusal fails the launch with a ``ConfigError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException

from harnessrl.controller.base import Launch
from harnessrl.controller.kubernetes import manifests
from harnessrl.controller.kubernetes.api import KubeApi
from harnessrl.controller.kubernetes.api_errors import describe, is_transient
from harnessrl.controller.kubernetes.attempts import Attempt, RunBook
from harnessrl.controller.kubernetes.names import WRITTEN_AT_ANNOTATION, attempt_labels
from harnessrl.controller.kubernetes.observed import parse_job
from harnessrl.errors import ConfigError, UpstreamError

log = logging.getLogger(__name__)


def render_attempt(
    api: KubeApi, launch: Launch, name: str, *, run_id: str, controller_id: str, workspace_dir: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Job and the Secret of one attempt, both named ``name``, labelled as this runner's."""
    cfg = api.config
    labels = attempt_labels(run_id, launch.rollout_id, launch.attempt, controller=controller_id)
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
        workspace_dir=workspace_dir,
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
        workspace_dir=workspace_dir,
    )
    return job, secret


class JobCreator:
    """Creates attempts' Secrets and Jobs in tasks of their own (``in_flight``: close waits for
    them, so no Job lands after the kill)."""

    def __init__(self, api: KubeApi, book: RunBook, *, run_id: str, clock: Callable[[], float]) -> None:
        self._api = api
        self._book = book
        self._run_id = run_id
        self._clock = clock
        self.in_flight: set[asyncio.Task] = set()

    def start(self, attempt: Attempt) -> asyncio.Task[None]:
        task = asyncio.create_task(self._create(attempt), name=f"harnessrl-k8s-create-{attempt.name}")
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)
        return task

    def refuse_foreign(self, attempt: Attempt) -> None:
        """Fail the launch with a ``ConfigError``: adopting the Job would record another rollout's
        outcome and log as this attempt's (and writing the Secret would hand that Job this key)."""
        error = ConfigError(
            f"Job {attempt.name} in namespace {self._api.config.namespace!r} was made for another "
            f"rollout with the id {attempt.launch.rollout_id!r} (attempt {attempt.launch.attempt}) and "
            f"another key: another store's run uses kubernetes.run_id {self._run_id!r} in this "
            "namespace too; give each run its own kubernetes.run_id"
        )
        self._book.fail(attempt, error)

    async def _foreign_job_exists(self, attempt: Attempt) -> bool:
        api = self._api
        try:
            job = await api.json(api.batch.read_namespaced_job, attempt.name, api.config.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return attempt.is_foreign((job.get("metadata") or {}).get("annotations"))

    async def _create(self, attempt: Attempt) -> None:
        api, ns, name = self._api, self._api.config.namespace, attempt.name
        # Stamped on every try: the grace that keeps other runners from sweeping it counts from here.
        attempt.secret["metadata"]["annotations"][WRITTEN_AT_ANNOTATION] = f"{self._clock():.3f}"
        adopting = False
        wrote_secret = False  # the Secret under this name is this attempt's (created or rewritten)
        try:
            try:
                await api.json(api.core.create_namespaced_secret, ns, attempt.secret)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                # Ours to rewrite unless another store's Job of this name uses it: its pod may not
                # have started yet, and would start with this attempt's key and task.
                if await self._foreign_job_exists(attempt):
                    self.refuse_foreign(attempt)
                    return
                await api.json(api.core.replace_namespaced_secret, name, ns, attempt.secret)
            wrote_secret = True
            try:
                job = await api.json(api.batch.create_namespaced_job, ns, attempt.job)
            except ApiException as exc:
                if exc.status != 409:  # 409: a predecessor created it; adopt it
                    raise
                adopting = True
                job = await api.json(api.batch.read_namespaced_job, name, ns)
                if attempt.is_foreign((job.get("metadata") or {}).get("annotations")):
                    self.refuse_foreign(attempt)
                    with contextlib.suppress(Exception):  # ours, under its name: its own was gone
                        await api.delete_secret(name)
                    return
        except ApiException as exc:
            if exc.status == 429 or exc.status >= 500:
                if await self._erring_too_long(attempt, describe(exc), wrote_secret=wrote_secret):
                    return
            else:
                attempt.erroring_since = None
            # A 404 on reading the Job a 409 said exists: it was being deleted (a predecessor's, killed
            # or swept) and is gone now, so the name is free again: create it on a later pass.
            if is_transient(exc) or (adopting and exc.status == 404):
                self._back_off(attempt)  # the attempt keeps waiting, like one without a free slot
                raise  # logged; a pass after the back-off tries again
            error = ConfigError(
                f"Kubernetes rejected {name}: {exc.status} {exc.reason} {exc.body or ''}".strip()
            )
            await self._fail(attempt, error, wrote_secret=wrote_secret)
            return
        except UpstreamError as exc:  # no answer at all (timed out, refused, reset): as a 5xx
            if await self._erring_too_long(attempt, str(exc), wrote_secret=wrote_secret):
                return
            self._back_off(attempt)
            raise
        attempt.create_failures = 0
        attempt.erroring_since = None
        self._book.jobs.setdefault(name, parse_job(job))
        await self._own_secret(name, job)
        self._book.mark_created(attempt)
        if attempt.done.done():  # killed while the create was in flight: do not leave it running
            await api.delete_job(name)
            await api.delete_secret(name)

    async def _own_secret(self, name: str, job: dict[str, Any]) -> None:
        """Make the Job the Secret's owner, so the garbage collector removes the Secret with the Job
        (its TTL) if we never do."""
        api = self._api
        owner = {"metadata": {"ownerReferences": [manifests.owner_reference(job)]}}
        try:
            await api.json(
                api.core.patch_namespaced_secret,
                name,
                api.config.namespace,
                owner,
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            log.warning("could not set the owner of Secret %s: %s", name, exc.reason)

    async def _erring_too_long(self, attempt: Attempt, detail: str, *, wrote_secret: bool) -> bool:
        """Count one create the API erred on (429, a 5xx, no answer in ``request_timeout_s``); once
        they have gone on in a row for ``stuck_pending_s``, fail the launch and say so (True). An API
        that only errs (a failing admission webhook answers 500 to every create, a slow one lets
        every create time out) left the launch waiting forever: an infrastructure failure, like a
        pod stuck pulling its image this long."""
        now = time.monotonic()
        attempt.erroring_since = attempt.erroring_since or now
        if now - attempt.erroring_since < self._api.config.stuck_pending_s:
            return False
        error = UpstreamError(
            f"Kubernetes API refused to create {attempt.name} for {now - attempt.erroring_since:.0f}s "
            f"(stuck_pending_s): {detail}"
        )
        await self._fail(attempt, error, wrote_secret=wrote_secret)
        return True

    def _back_off(self, attempt: Attempt) -> None:
        """The next create of ``attempt`` waits a little longer (up to ``poll_interval_s``)."""
        attempt.create_failures += 1
        backoff = min(self._api.config.poll_interval_s, 0.25 * 2**attempt.create_failures)
        attempt.retry_at = time.monotonic() + backoff

    async def _fail(self, attempt: Attempt, error: Exception, *, wrote_secret: bool) -> None:
        """The create is given up: ``launch()`` raises ``error``. A Job a 5xx may have created after
        all carries this runner's id and no attempt wants it: the orphan sweep deletes it."""
        self._book.attempts.pop(attempt.name, None)
        if wrote_secret:  # it has no use now (one we did not write may be another store's Job's)
            with contextlib.suppress(Exception):
                await self._api.delete_secret(attempt.name)
        self._book.fail(attempt, error)
