"""An attempt that ended: its harness's log saved, its Job deleted if it still runs, then ``wait``.

The order matters: deleting a Job takes its pods, and their logs, along, so a Job the runner stops
itself (a stuck pod, a sidecar outliving the harness) is deleted only once the log is saved
(``saving`` names those Jobs, which the reconcile pass must not delete meanwhile). A log that
cannot be read never changes the outcome.
"""

from __future__ import annotations

import asyncio
import logging

from harnessrl.controller.base import Exit
from harnessrl.controller.kubernetes.api import KubeApi
from harnessrl.controller.kubernetes.attempts import Attempt, RunBook, settle
from harnessrl.controller.kubernetes.observed import ObservedPod

log = logging.getLogger(__name__)


class Endings:
    """Ends attempts in tasks of their own (``in_flight``: close waits for them)."""

    def __init__(self, api: KubeApi, book: RunBook) -> None:
        self._api = api
        self._book = book
        self.in_flight: set[asyncio.Task] = set()  # saving logs of ended attempts
        # Jobs of ended attempts whose log is being saved: deleted (if they must be) only after that.
        self.saving: set[str] = set()

    def resolve(self, attempt: Attempt, exit_: Exit, *, delete_job: bool = False) -> None:
        """The attempt ended: save its pod's log, then (``delete_job``: its Job still runs) delete
        the Job, then let ``wait`` return."""
        self._book.attempts.pop(attempt.name, None)
        settle(attempt.created)
        pod = self._book.last_pod(attempt.name)
        self.saving.add(attempt.name)
        task = asyncio.create_task(self._finish(attempt, exit_, pod, delete_job=delete_job))
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)

    async def _finish(
        self, attempt: Attempt, exit_: Exit, pod: ObservedPod | None, *, delete_job: bool = False
    ) -> None:
        try:
            if pod is not None and not attempt.done.done():
                try:
                    await self._save_log(attempt, pod)
                except Exception as exc:  # deliberate: a missing log never changes the outcome
                    log.warning("could not save the log of %s: %s", pod.name, exc)
            if delete_job:
                try:
                    await self._api.delete_job(attempt.name)
                except Exception as exc:  # deliberate: the orphan sweep or its deadline ends it later
                    log.warning("could not delete the Job %s: %s", attempt.name, exc)
        finally:
            self.saving.discard(attempt.name)
            settle(attempt.done, exit_)

    async def _save_log(self, attempt: Attempt, pod: ObservedPod) -> None:
        """The end of the harness container's log (its last ``max_log_bytes``) as ``stdout.log``
        (Kubernetes merges stdout and stderr): a long log's end is where a harness prints its answer
        and a failing one says why."""
        data = await self._api.read_log_tail(pod.name, pod.harness_container, self._api.config.max_log_bytes)
        path = attempt.launch.log_dir / "stdout.log"

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)

        await asyncio.to_thread(write)
