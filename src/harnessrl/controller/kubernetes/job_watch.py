"""The watch on the run's Jobs: a thread that streams their changes to the event loop.

It watches from the resourceVersion of the runner's last full list (``resume_from``), restarting the
stream when it times out. When the API has compacted that history (``410 Expired``) it asks the
runner to list again and waits for the new version. Events reach the runner through
``loop.call_soon_threadsafe``, so everything else stays on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from harnessrl.controller.kubernetes.api import KubeApi

log = logging.getLogger(__name__)


class JobWatch:
    """``on_event(type, job)`` for every ADDED, MODIFIED or DELETED Job matching ``selector``;
    ``on_expired()`` when the runner must list again. Runs until ``closing`` is set."""

    def __init__(
        self,
        api: KubeApi,
        selector: str,
        *,
        loop: asyncio.AbstractEventLoop,
        closing: threading.Event,
        on_event: Callable[[str, dict[str, Any]], None],
        on_expired: Callable[[], None],
    ) -> None:
        self._api = api
        self._selector = selector
        self._loop = loop
        self._closing = closing
        self._on_event = on_event
        self._on_expired = on_expired
        self._rv: str | None = None
        self._rv_lock = threading.Lock()
        self._rv_ready = threading.Event()
        self._watch: k8s_watch.Watch | None = None
        self._thread: threading.Thread | None = None

    def resume_from(self, resource_version: str | None) -> None:
        """Watch from ``resource_version`` (a full list's) on."""
        with self._rv_lock:
            self._rv = resource_version
        self._rv_ready.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="harnessrl-k8s-watch", daemon=True)
        self._thread.start()

    async def stop(self, timeout_s: float = 10) -> None:
        """Wait (up to ``timeout_s``) for the thread to end; ``closing`` must be set."""
        deadline = time.monotonic() + timeout_s
        while self._thread is not None and self._thread.is_alive() and time.monotonic() < deadline:
            # Watch.stop() shuts the socket down so the blocked read returns; repeated because a stop
            # that lands while the request is still being sent is forgotten when stream() begins.
            if self._watch is not None:
                self._watch.stop()
            await asyncio.sleep(0.02)

    def _run(self) -> None:
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
                self._stream(watch, rv)
                backoff = 0.1
            except ApiException as exc:
                if exc.status == 410:  # history compacted: relist, then watch from the list's version
                    with self._rv_lock:
                        self._rv = None
                    self._rv_ready.clear()
                    self._loop.call_soon_threadsafe(self._on_expired)
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

    def _stream(self, watch: k8s_watch.Watch, rv: str) -> None:
        """One watch request, from ``rv`` until it times out (or ``closing``)."""
        cfg = self._api.config
        for event in watch.stream(
            self._api.batch.list_namespaced_job,
            cfg.namespace,
            label_selector=self._selector,
            resource_version=rv,
            timeout_seconds=cfg.watch_timeout_s,
            allow_watch_bookmarks=True,
            _request_timeout=cfg.watch_timeout_s + 30,
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
