"""Group commit: one writer thread makes every answered call durable, several per transaction.

Every model call ends with a store write that must be committed before the client gets its answer.
Handing each write to the thread pool costs a thread hop (a lock hand-off and a wake-up of the
event loop) and one transaction per call. Here the calls go into one queue; a single thread takes
whatever is waiting, writes it all in one transaction (``store.add_calls``, each call under its own
savepoint so a bad call fails alone) and wakes each event loop once for the whole batch. Under
load, calls that finish while a transaction is being written share the next one; alone, a call
is written at once, as before.

Each caller still waits for its own call's commit: ``add`` returns the stored call (``seq`` set)
only after the transaction holding it committed, or raises that call's own error.

When nothing is queued or being written, a call is written at once on the caller's own thread
(``store.add_call_now``: SQLite, whose write lock is free, is written without waiting; anything
else says no and the call goes to the thread). One call at a time, the hop to the thread and back
(two thread wake-ups) cost ~50 us of a call's ~1.9 ms of gateway CPU, and group commit had
nothing to share.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Sequence
from typing import Any

from harnessrl.schemas import Call
from harnessrl.store.base import Store
from harnessrl.store.chains import EncodedItems

log = logging.getLogger("harnessrl.gateway")

#: Most calls written in one transaction (bounds how long the first of them waits for the commit).
MAX_BATCH = 64

_Item = tuple[Call, "EncodedItems | None", asyncio.AbstractEventLoop, "asyncio.Future[Call]"]


class CallWriter:
    """The gateway's one writer thread for answered calls (started on first use, daemon)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.batches = 0  # transactions written by the thread (for tests and metrics)
        self.written_at_once = 0  # calls written on their caller's thread (``add_call_now``)
        self._writing = False  # the thread holds calls it has not answered yet

    @property
    def writing(self) -> bool:
        """Whether the writer's thread holds calls it has not answered yet (waiting for the lock, say)."""
        return self._writing

    @property
    def queued(self) -> int:
        """Calls waiting for the writer's thread to take them."""
        return self._queue.qsize()

    async def add(self, call: Call, encoded: EncodedItems | None = None) -> Call:
        """``store.add_call(call, encoded)``, committed (maybe with other calls) before this returns."""
        stored = self.add_now(call, encoded)
        if stored is not None:
            return stored
        return await self.add_queued(call, encoded)

    def add_now(self, call: Call, encoded: EncodedItems | None = None) -> Call | None:
        """``store.add_call(call, encoded)`` on the caller's thread when nothing is queued or being
        written and the store can write at once; else ``None`` (then ``add_queued``). It never waits,
        so a caller that must not be cancelled during the write needs no shield for it."""
        if self._writing or not self._queue.empty():
            return None
        stored = self._store.add_call_now(call, encoded)  # no wait: None when the lock is taken
        if stored is not None:
            self.written_at_once += 1
        return stored

    async def add_queued(self, call: Call, encoded: EncodedItems | None = None) -> Call:
        """``store.add_call(call, encoded)`` by the writer's thread, committed (maybe with other calls)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Call] = loop.create_future()
        self._ensure_thread()
        self._queue.put((call, encoded, loop, future))
        return await future

    def close(self) -> None:
        """Write what is queued, then stop the thread (a later ``add`` starts a new one)."""
        with self._start_lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()

    def _ensure_thread(self) -> None:
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="harnessrl-call-writer", daemon=True
                    )
                    self._thread.start()

    def _run(self) -> None:
        while True:
            self._writing = False
            item = self._queue.get()
            self._writing = True
            if item is None:
                return
            batch = [item]
            stop = False
            while len(batch) < MAX_BATCH:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                batch.append(more)
            self._deliver(batch, self._write([call for call, *_ in batch], [item[1] for item in batch]))
            if stop:
                return

    def _write(
        self, calls: Sequence[Call], encoded: Sequence[EncodedItems | None]
    ) -> list[Call | BaseException]:
        self.batches += 1
        if len(calls) == 1:  # a lone call: no savepoint needed
            try:
                return [self._store.add_call(calls[0], encoded[0])]
            except Exception as exc:  # noqa: BLE001 - the caller gets its own call's error
                return [exc]
        try:
            return list(self._store.add_calls(calls, encoded))
        except Exception as exc:  # noqa: BLE001 - the commit failed: no call of the batch was added
            return [exc] * len(calls)

    @staticmethod
    def _deliver(batch: list[_Item], results: list[Call | BaseException]) -> None:
        # One wake-up per event loop for the whole batch, not one per call.
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Call], Any]]] = {}
        for (_, _, loop, future), result in zip(batch, results, strict=True):
            by_loop.setdefault(loop, []).append((future, result))
        for loop, pairs in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve, pairs)
            except RuntimeError:  # the loop closed (shutdown): nobody is waiting any more
                log.debug("call writer: event loop closed before %d call(s) were answered", len(pairs))


def _resolve(pairs: list[tuple[asyncio.Future[Call], Any]]) -> None:
    for future, result in pairs:
        if future.cancelled():
            continue
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)
