"""The shell around ``reconcile.plan``: list what the run has, plan, and do what the plan says.

An informer in miniature: a full list every ``poll_interval_s`` (and after the watch expires with
410) plus the Job watch (``job_watch``) from the list's resourceVersion in between. Every pass lists
the run's pods (their container states say *why* a Job failed), plans, and executes: creates
(``job_creator``), endings (``endings``), deletes. Only a pass creates Jobs, so the concurrency cap
is enforced in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from harnessrl.controller.kubernetes.api import KubeApi
from harnessrl.controller.kubernetes.attempts import Attempt, RunBook
from harnessrl.controller.kubernetes.endings import Endings
from harnessrl.controller.kubernetes.job_creator import JobCreator
from harnessrl.controller.kubernetes.job_watch import JobWatch
from harnessrl.controller.kubernetes.observed import (
    ObservedJob,
    attach_pods,
    parse_job,
    parse_pod,
    parse_secret,
)
from harnessrl.controller.kubernetes.reconcile import DesiredAttempt, classify, plan
from harnessrl.errors import UpstreamError

log = logging.getLogger(__name__)


class Reconciler:
    """Keeps the run's Jobs as ``book`` wants them. ``open`` lists and starts the watch and the
    loop; ``close`` (once ``closing`` is set) stops them and waits for creates and endings."""

    def __init__(
        self,
        api: KubeApi,
        book: RunBook,
        *,
        selector: str,
        controller_id: str,
        run_id: str,
        clock: Callable[[], float],
        closing: threading.Event,
    ) -> None:
        self._api = api
        self._book = book
        self._selector = selector
        self._controller_id = controller_id
        self._clock = clock
        self._closing = closing
        self.creator = JobCreator(api, book, run_id=run_id, clock=clock)
        self.endings = Endings(api, book)
        self._relist = True
        self._wake: asyncio.Event | None = None
        self._started_at: float | None = None
        self._task: asyncio.Task | None = None
        self._watch: JobWatch | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    async def open(self) -> None:
        """List what exists, then start the watch and the loop. A refused list raises the client's
        ``ApiException`` and starts nothing."""
        self._wake = asyncio.Event()
        self._watch = JobWatch(
            self._api,
            self._selector,
            loop=asyncio.get_running_loop(),
            closing=self._closing,
            on_event=self._on_event,
            on_expired=self._request_relist,
        )
        await self._full_list()
        self._started_at = self._clock()
        self._watch.start()
        self._task = asyncio.create_task(self._run(), name="harnessrl-k8s-reconcile")

    async def close(self) -> None:
        """Stop the loop; let creates in flight land (a kill after them finds their Jobs); stop the
        watch; wait for endings saving logs."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        request_timeout_s = self._api.config.request_timeout_s
        if self.creator.in_flight:  # a create still in flight lands after any kill: let it, then kill
            await asyncio.wait(set(self.creator.in_flight), timeout=4 * request_timeout_s)
        if self._watch is not None:
            await self._watch.stop()
        if self.endings.in_flight:
            await asyncio.wait(set(self.endings.in_flight), timeout=request_timeout_s)

    def kick(self) -> None:
        """Run a pass now."""
        if self._wake is not None:
            self._wake.set()

    def _request_relist(self) -> None:
        self._relist = True
        self.kick()

    async def _run(self) -> None:
        assert self._wake is not None
        cfg = self._api.config
        next_list = time.monotonic() + cfg.poll_interval_s
        failing_since: float | None = None  # time.monotonic() of the first of the failed passes in a row
        while not self._closing.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, next_list - time.monotonic()))
            self._wake.clear()
            try:
                if self._relist or time.monotonic() >= next_list:
                    await self._full_list()
                    next_list = time.monotonic() + cfg.poll_interval_s
                else:
                    await self._list_pods()
                await self._reconcile_once()
                failing_since = None
            except Exception as exc:  # deliberate: one failed pass must not stop the loop
                log.warning("kubernetes reconcile pass failed: %s", exc)
                self._relist = True
                failing_since = failing_since or time.monotonic()
                self._fail_waiting_launches(exc, time.monotonic() - failing_since)
                await asyncio.sleep(min(1.0, cfg.poll_interval_s))

    def _fail_waiting_launches(self, exc: Exception, failing_for: float) -> None:
        """After ``stuck_pending_s`` of failed passes, fail every launch still waiting for its Job
        (an ``UpstreamError``: INFRA, retried by the controller). Only a pass creates Jobs, so an API
        that refuses the lists (every request a 5xx, credentials expired: 401) left them waiting
        forever, and the controller's slots with them. Attempts whose Jobs exist run on: their
        outcome is read when the API answers again."""
        if failing_for < self._api.config.stuck_pending_s:
            return
        error = UpstreamError(
            f"Kubernetes API failed every reconcile pass for {failing_for:.0f}s (stuck_pending_s); "
            f"the Job was never created: {exc}"
        )
        for attempt in [a for a in self._book.attempts.values() if not a.is_created]:
            # A create still in flight that lands after this deletes its Job (JobCreator: done is set).
            self._book.fail(attempt, error)

    async def _list_pods(self) -> None:
        api = self._api
        pods = await api.json(
            api.core.list_namespaced_pod, api.config.namespace, label_selector=self._selector
        )
        self._book.pods = [parse_pod(p) for p in pods.get("items") or ()]

    async def _full_list(self) -> None:
        book, api = self._book, self._api
        list_seq = book.next_seq()
        ns, sel = api.config.namespace, self._selector
        jobs = await api.json(api.batch.list_namespaced_job, ns, label_selector=sel)
        secrets = await api.json(api.core.list_namespaced_secret, ns, label_selector=sel)
        await self._list_pods()
        book.jobs = {j["metadata"]["name"]: parse_job(j) for j in jobs.get("items") or ()}
        book.secrets = {s["metadata"]["name"]: parse_secret(s) for s in secrets.get("items") or ()}
        for attempt in book.attempts.values():  # created before this list began, yet absent: gone
            if attempt.is_created and attempt.created_seq < list_seq and attempt.name not in book.jobs:
                attempt.vanished = True
        self._relist = False
        assert self._watch is not None
        self._watch.resume_from((jobs.get("metadata") or {}).get("resourceVersion"))

    def _secret_grace_s(self) -> float:
        """How old (since last written) a Secret with no Job must be before any runner of the run
        sweeps it: ``orphan_grace_s``, but never less than a peer's create can take between writing
        its Secret and its Job showing in our lists (a back-off, the two requests, our list)."""
        cfg = self._api.config
        return max(cfg.orphan_grace_s, cfg.poll_interval_s + 4 * cfg.request_timeout_s)

    @staticmethod
    def _desired(attempt: Attempt, job: ObservedJob | None) -> DesiredAttempt:
        return DesiredAttempt(
            attempt.name,
            attempt.launch.rollout_id,
            attempt.launch.attempt,
            created=attempt.is_created,
            vanished=attempt.vanished,
            harness_started_at=attempt.seen_running(job),
            timeout_s=attempt.launch.timeout_s,
        )

    async def _reconcile_once(self) -> None:
        book, cfg = self._book, self._api.config
        for attempt in list(book.attempts.values()):  # before plan() would adopt another's Job
            job_seen = book.jobs.get(attempt.name)
            if not attempt.is_created and job_seen is not None and attempt.is_foreign(job_seen.annotations):
                self.creator.refuse_foreign(attempt)
        observed = attach_pods(book.jobs, book.pods)
        desired = [self._desired(a, observed.get(a.name)) for a in book.attempts.values()]
        now = self._clock()
        assert self._started_at is not None
        actions = plan(
            desired,
            observed,
            max_concurrent=cfg.max_concurrent_jobs,
            now=now,
            stuck_pending_s=cfg.stuck_pending_s,
            delete_orphans=now - self._started_at >= cfg.orphan_grace_s,
            observed_secrets=book.secrets,
            orphan_secret_grace_s=self._secret_grace_s(),
            owner=self._controller_id,
        )
        for name in actions.adopted:
            book.mark_created(book.attempts[name])
        # An ended attempt whose Job still runs (a stuck pod, a sidecar that outlives the harness) is
        # deleted by its ending, once the harness's log is saved.
        stop_after_log = set(actions.completed) & set(actions.delete)
        for name, exit_ in actions.completed.items():
            self.endings.resolve(book.attempts[name], exit_, delete_job=name in stop_after_log)
        ready = time.monotonic()
        creates = [
            self.creator.start(a) for d in actions.create if (a := book.attempts[d.name]).retry_at <= ready
        ]
        deletes = [
            self._api.delete_job(n)
            for n in actions.delete
            if n not in stop_after_log and n not in self.endings.saving
        ]
        deletes += [self._api.delete_secret(n) for n in actions.delete_secrets]
        deletes += [self._api.delete_secret(n) for n in actions.completed]
        # Shielded: cancelling this pass (close) must not abandon a create whose request is already
        # on its way; close waits for it instead, so no Job lands after the kill.
        results = await asyncio.gather(
            *(asyncio.shield(t) for t in creates), *deletes, return_exceptions=True
        )
        for result in results:
            if isinstance(result, Exception):
                log.warning("kubernetes reconcile action failed: %s", result)

    # ---- watch events (posted to the event loop by the watch thread) --------------------------
    def _on_event(self, type_: str, obj: dict[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        if type_ == "DELETED":
            last = self._book.jobs.pop(name, None) or parse_job(obj)
            attempt = self._book.attempts.get(name)
            if attempt is not None and attempt.is_created:
                self._on_deleted(attempt, last)
        else:
            self._book.jobs[name] = parse_job(obj)
        self.kick()

    def _on_deleted(self, attempt: Attempt, last: ObservedJob) -> None:
        """The attempt's Job is gone: its outcome from the last state seen, else it vanished."""
        pods = [p for p in self._book.pods if p.job_name == attempt.name]
        job = attach_pods({attempt.name: last}, pods)[attempt.name]
        exit_ = classify(
            job,
            now=self._clock(),
            stuck_pending_s=self._api.config.stuck_pending_s,
            harness_started_at=attempt.seen_running(job),
            timeout_s=attempt.launch.timeout_s,
        )
        if exit_ is not None:
            self.endings.resolve(attempt, exit_)
        else:
            attempt.vanished = True
