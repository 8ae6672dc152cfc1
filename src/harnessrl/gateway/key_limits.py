"""A cap on the model requests one API key has in flight at once (``gateway.max_requests_per_key``).

A rollout is one agent: a handful of concurrent calls at most (parallel tool calls, subagents). A
buggy or hostile harness that opens hundreds at once with its key would otherwise take the gateway's
connections, threads and engine slots from every other rollout. Past the cap the request is
answered 429 ``overloaded`` with ``retry-after: 1`` in the provider's shape (the SDKs retry it)
before any work is done. Counted per key as sent (valid or not), from the request's arrival to its
answer's last byte, streams included: an ASGI middleware, because only there does a stream's end show.

The counts live in one process (``LocalKeyCounts``) or, for ``--workers``, in memory the worker
processes share (``SharedKeyCounts``): counted per process, N workers let a key have N times the cap
in flight, as the kernel spread its connections over them.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import multiprocessing
from collections.abc import Callable
from typing import Protocol

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from harnessrl.errors import Overloaded
from harnessrl.gateway.auth import header_key
from harnessrl.gateway.errors import anthropic_error_response, error_response, is_anthropic_route

log = logging.getLogger(__name__)

_MODEL_PREFIXES = ("/v1/", "/rollouts/")


class KeyCounts(Protocol):
    """Model requests in flight per API key."""

    def take(self, key: bytes, limit: int) -> int | None:
        """Count one more request of ``key`` unless ``limit`` are in flight: ``None`` if taken, else
        how many are in flight."""
        ...

    def give_back(self, key: bytes) -> None:
        """One request of ``key`` (taken) ended."""
        ...


class LocalKeyCounts:
    """The counts of this process alone."""

    def __init__(self) -> None:
        self.in_flight: dict[bytes, int] = {}

    def take(self, key: bytes, limit: int) -> int | None:
        count = self.in_flight.get(key, 0)
        if count >= limit:
            return count
        self.in_flight[key] = count + 1
        return None

    def give_back(self, key: bytes) -> None:
        left = self.in_flight[key] - 1
        if left:
            self.in_flight[key] = left
        else:
            del self.in_flight[key]


class SharedKeyCounts:
    """The counts of every process forked after this was made (``gateway.workers``): a table of
    (key hash, count) slots in shared memory, open addressing, under one process-shared lock.

    A key's slot is the first of ``PROBES`` from its hash's position that holds its hash; a new key
    takes the first slot there with no request in flight. Where none is free (more keys in flight
    than the table holds around that position) the request is let through uncounted here: the
    per-process cap still applies to it. A lock not had within ``LOCK_TIMEOUT_S`` (a worker killed
    while holding it) is given up for good: this process counts on its own from then on, so the
    event loop waits that long once, not on every request."""

    SLOTS = 1 << 14
    PROBES = 64
    LOCK_TIMEOUT_S = 1.0

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("fork")
        self._lock = ctx.Lock()
        self._own = LocalKeyCounts()  # used once the shared lock was given up
        self._given_up = False
        self._table = ctx.RawArray(
            ctypes.c_int64, 2 * self.SLOTS
        )  # [hash, count] per slot; hash 0: never used

    @staticmethod
    def _hash(key: bytes) -> int:
        value = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little", signed=True)
        return value or 1

    def _find(self, hashed: int) -> tuple[int | None, int | None]:
        """(the slot holding ``hashed``, the first slot a new key may take); under the lock."""
        table, free = self._table, None
        for probe in range(self.PROBES):
            slot = (hashed + probe) % self.SLOTS
            if table[2 * slot] == hashed:
                return slot, free
            if table[2 * slot + 1] == 0 and free is None:
                free = slot
            if table[2 * slot] == 0:  # never used: the key is not further on
                break
        return None, free

    def _locked(self) -> bool:
        """Take the shared lock, or give it up for good (False) if it is not had in time."""
        if self._given_up:
            return False
        if self._lock.acquire(timeout=self.LOCK_TIMEOUT_S):
            return True
        self._given_up = True
        log.warning(
            "the workers' shared per-key counts stayed locked for %.0f s (a worker killed holding "
            "the lock?): this worker counts its own requests per key from now on",
            self.LOCK_TIMEOUT_S,
        )
        return False

    def take(self, key: bytes, limit: int) -> int | None:
        if self._given_up:
            return self._own.take(key, limit)
        hashed = self._hash(key)
        if not self._locked():
            return self._own.take(key, limit)
        try:
            slot, free = self._find(hashed)
            if slot is None:
                if free is None:
                    return None
                slot = free
                self._table[2 * slot] = hashed
            count = self._table[2 * slot + 1]
            if count >= limit:
                return count
            self._table[2 * slot + 1] = count + 1
            return None
        finally:
            self._lock.release()

    def give_back(self, key: bytes) -> None:
        if key in self._own.in_flight:  # taken after the lock was given up
            self._own.give_back(key)
            return
        hashed = self._hash(key)
        if not self._locked():
            return
        try:
            slot, _ = self._find(hashed)
            if slot is not None and self._table[2 * slot + 1] > 0:  # > 0: an uncounted take ending
                self._table[2 * slot + 1] -= 1
        finally:
            self._lock.release()


class PerKeyLimit:
    """ASGI middleware: at most ``limit`` model requests in flight per API key; ``on_refused()`` is
    called for each request it answers 429 (the app counts it in its error metrics). ``counts``:
    where the requests in flight are counted (this process's own, unless given)."""

    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        on_refused: Callable[[], None] = lambda: None,
        counts: KeyCounts | None = None,
    ) -> None:
        self.app = app
        self.limit = limit
        self.on_refused = on_refused
        self.counts = LocalKeyCounts() if counts is None else counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = None
        if scope["type"] == "http" and scope["path"].startswith(_MODEL_PREFIXES):
            key = header_key(scope["headers"])
        if key is None:
            await self.app(scope, receive, send)
            return
        count = self.counts.take(key, self.limit)
        if count is not None:
            exc = Overloaded(
                f"this API key has {count} model requests in flight, the most the gateway serves at once "
                "for one key (gateway.max_requests_per_key); retry when one has finished"
            )
            self.on_refused()
            anthropic = is_anthropic_route(scope["path"])
            response = anthropic_error_response(exc) if anthropic else error_response(exc)
            await response(scope, receive, send)
            return
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.counts.give_back(key)

        async def send_releasing(message: Message) -> None:
            # Released as the answer's last byte goes out, not when the route returns a moment
            # later: a client that sends its next call as soon as it has the answer is not refused.
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                release()
            await send(message)

        try:
            await self.app(scope, receive, send_releasing)
        finally:
            release()
