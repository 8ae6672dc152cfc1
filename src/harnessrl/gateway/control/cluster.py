"""Every gateway of one gate as one: the gate's state and the membership live in the store.

The store holds one gate per name (``gateway.gate``; paused or open, the live policy version, a
command counter that every pause or resume of it increments in its transaction) and one heartbeat
row per gateway process naming its gate (``store.gate``, written by ``gateway.control.heartbeat``).
Gateways of other gates on the same store (another run's) are neither paused, resumed nor waited
for, and their notifications are ignored. ``Cluster`` is one gateway's side of its gate:

- On start it listens for the store's notifications (PostgreSQL ``LISTEN``), registers its row (so
  a pause committed from then on waits for its ack), then reads the gate and applies it to its own
  ``PauseGate`` before the app takes a call: a gateway started or restarted during a pause comes up
  paused, and adopts the live policy version.
- It applies every newer command it learns of (a notification wakes it, a slow timer is the backstop;
  SQLite, which cannot notify, is looked at on a short timer) and acks it in its heartbeat row: the
  command applied, whether it is quiet (paused, no call in flight), and a lease refreshed every third
  of ``lease_s`` (a gateway that stops, SIGKILL, is not waited for past it; a clean stop deletes it).

A pause (``command(paused=True)`` then ``wait_drained``) waits for the rule of ``drain``. Racing
commands need no clock of ours: the database orders them, and every gateway ends in the state of
the last committed one; a newer pause does not fail an older one (both wait for the same drain).

Any gateway takes commands (``control.gating``): a load balancer in front of a Deployment of gateways
needs no peer list; a gateway joins by starting and leaves by stopping (docs/scale.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from typing import TypeVar

import anyio.to_thread

from harnessrl.engines.base import Engine
from harnessrl.gateway.control.drain import acked_quiet, check_not_overtaken, next_look, with_counts
from harnessrl.gateway.control.heartbeat import Ack, Heartbeat
from harnessrl.gateway.control.pause import PauseGate
from harnessrl.store.base import Store
from harnessrl.store.gate import DEFAULT_GATE, GateState, GatewayRow, parse_command_payload, payload_gate

log = logging.getLogger("harnessrl.gateway")
T = TypeVar("T")

#: Seconds between looks at the gate when the store notifies (the backstop for a lost notification).
BACKSTOP_S = 5.0
#: Seconds between looks at the gate when it cannot (SQLite: a read of a local file).
POLL_S = 0.05
#: Seconds between tries while the store fails (short: a lease lapses at two thirds of ``lease_s``).
RETRY_S = 0.05


class Cluster:
    """This gateway's membership: applies the store's gate to ``gate`` and acks it in a heartbeat row."""

    def __init__(
        self,
        store: Store,
        gate: PauseGate,
        engine: Engine,
        *,
        lease_s: float = 10.0,
        shared: bool = False,
        clock: Callable[[], float] = time.time,
        gate_name: str = DEFAULT_GATE,
    ) -> None:
        self.store = store
        self.gate = gate
        self.engine = engine
        self.clock = clock
        self.gate_name = gate_name  # the store's gate this gateway serves under (``gateway.gate``)
        self.heartbeat = Heartbeat(store, lease_s=lease_s, clock=clock, gate=gate_name)
        self.applied = 0  # the last command applied to ``gate``
        self._shared = shared
        # No other process can reach the gate (SQLite in memory): only the backstop's timer is needed.
        self._private = not store.notifies_gate and store.local_file is None
        self._event: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop_watch: Callable[[], None] | None = None
        self._pushes = False
        self._waiters = 0  # pauses waiting here for a drain (``wait_drained``)
        self._released = (0, 0)  # (command, calls its resume released here), as last applied
        self._sync_wanted = asyncio.Event()  # the sync loop has something to do
        self._read_wanted = True  # ... and it is reading the gate
        gate.on_quiet = self._quiet

    @property
    def gateway_id(self) -> str:
        return self.heartbeat.gateway_id

    @property
    def shares_store(self) -> bool:
        """Whether other gateways may write calls into this store (its caches can go stale): always
        on a server store (any gateway may join), and for ``--workers`` on a SQLite file."""
        return self._shared or self.store.notifies_gate

    def fence_mark(self) -> int | None:
        """What a call notes as it starts generating, for ``lapsed_since``; ``None`` where no other
        gateway waits on this one (its store is not shared): nothing to fence."""
        return self.heartbeat.lapses if self.shares_store else None

    def lapsed_since(self, mark: int | None) -> bool:
        """Whether this gateway's lease lapsed since ``fence_mark()`` gave ``mark`` (or has lapsed
        now): a pause elsewhere may have stopped waiting for it meanwhile (``heartbeat``'s fence)."""
        if mark is None:
            return False
        return self.heartbeat.lapses != mark or self.heartbeat.lapsed(self.clock())

    @property
    def tick_s(self) -> float:
        """Seconds between looks at the gate: the backstop where the store notifies or no other
        process can reach it (SQLite in memory), else the poll (another process may share a file)."""
        return BACKSTOP_S if self._pushes or self._private else POLL_S

    # -- lifecycle ------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Listen, read and apply the gate, register; then keep in step until ``stop``."""
        loop = asyncio.get_running_loop()
        listening = asyncio.Event()

        def notified(payload: str) -> None:  # on the listener's thread
            about = payload_gate(payload)
            if about is not None and about != self.gate_name:
                return  # another gate's (another run's) command, ack or leave
            if not self._waiters and payload.startswith(("ack ", "leave ")):
                return  # only a pause waiting for a drain cares (16 gateways: 16 acks x 16 loops)
            with contextlib.suppress(RuntimeError):  # the loop closed under a late notification
                loop.call_soon_threadsafe(listening.set)
                loop.call_soon_threadsafe(self._notified, payload)

        self._stop_watch = self.store.watch_gate(notified)
        self._pushes = self._stop_watch is not None
        if self._pushes:
            # The listener calls once it is listening: a command committed after that wakes us, one
            # committed before it is in the row read next. (Bounded: a store that cannot be reached
            # is the pool's error on the read below.)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(listening.wait(), 30.0)
        # Registered (command 0: acked nothing, not quiet) *before* reading the gate: a pause
        # committed after this write finds the row and waits for the ack; one committed before it
        # is in the read. Registered after the read, a pause committed in between was answered
        # drained without this gateway, which then opened as read and took calls during the pause.
        await self.ack(force=True)
        await self.sync()
        self._task = asyncio.create_task(self._run(), name="harnessrl-gate-sync")

    async def stop(self) -> None:
        if self._stop_watch is not None:
            self._stop_watch()
            self._stop_watch = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await self.heartbeat.leave()
        except Exception:  # noqa: BLE001 - the lease ends on its own
            log.warning(
                "could not remove gateway %s from the store's gateways", self.gateway_id, exc_info=True
            )

    async def _run(self) -> None:
        failing = False
        while True:
            self._sync_wanted.clear()
            read, self._read_wanted = self._read_wanted, False
            try:
                if read:
                    self.apply(await self._read_gate())
                await self.ack()
                failing = False
            except Exception:  # noqa: BLE001 - keep in step once the store answers again
                self._read_wanted = True
                if not failing:  # once per outage, not once per tick
                    log.warning(
                        "gateway %s could not read the gate or write its heartbeat",
                        self.gateway_id,
                        exc_info=True,
                    )
                failing = True
            wait = min(self.tick_s, max(0.0, self.heartbeat.next_beat - self.clock()))
            if failing:
                # The beat is due and its write failed (a full disk, a read-only file): its time
                # never moves on, so without a pause the loop retried at once, thousands of times a
                # second, a core and the event loop spent on it for as long as the outage lasted.
                wait = max(wait, RETRY_S)
            try:  # (a timeout scope, not wait_for: no task to create and cancel on every tick)
                async with asyncio.timeout(wait):
                    await self._sync_wanted.wait()
            except TimeoutError:
                self._read_wanted = True  # the backstop (or, without notifications, the poll)

    # -- keeping in step ------------------------------------------------------------------------------
    def _notified(self, payload: str) -> None:
        """A notification: a command is applied from its payload at once (and acked by the sync
        loop); ``""`` (listening again: something may have been missed) makes the loop read the
        gate; an ack or a leave only wakes those waiting for a drain."""
        kind = payload.partition(" ")[0]
        if kind not in ("ack", "leave"):
            command = parse_command_payload(payload)
            if command is None:
                self._read_wanted = True
            else:
                self.apply(command)
            self._sync_wanted.set()
        self._wake()

    def _quiet(self) -> None:
        """The gate's last call in flight ended while closed: ack it, and tell the waiters."""
        self._sync_wanted.set()
        self._wake()

    def _changed(self) -> asyncio.Event:
        """The event the next change sets (take it *before* reading, so no change is missed)."""
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    def _wake(self) -> None:
        event, self._event = self._changed(), asyncio.Event()
        event.set()

    async def sync(self) -> None:
        self.apply(await self._read_gate())
        await self.ack()

    async def _read_gate(self) -> GateState:
        read = self._of_gate(self.store.read_gate)
        if self.store.reads_at_once:  # a local file: the poll's read costs less than a thread hop
            return read()
        return await anyio.to_thread.run_sync(read)

    def _gate_kwargs(self) -> dict[str, str]:
        return {} if self.gate_name == DEFAULT_GATE else {"gate": self.gate_name}

    def _of_gate(self, method: Callable[..., T]) -> Callable[[], T]:
        """The store's ``method`` (``read_gate``, ``read_gate_and_gateways``) for this gateway's gate.
        The default gate's calls name none, as before gates had names (a store's wrapper of that
        time still serves a gateway of the default gate)."""
        if self.gate_name == DEFAULT_GATE:
            return method
        return functools.partial(method, self.gate_name)

    def apply(self, state: GateState) -> int:
        """Put ``gate`` (and the engine's version) in ``state`` if it is newer; calls released."""
        if state.command <= self.applied:
            return 0
        self.applied = state.command
        # The version first: no call the resume admits may be labelled with the older one.
        version = state.policy_version
        if version is not None and self.engine.shares_weights and version != self.engine.policy_version:
            self.engine.adopt_policy_version(version)
        released = 0
        if state.paused:
            self.gate.close()
        else:
            released = self.gate.resume()
        self._released = (state.command, released)
        return released

    @property
    def quiet(self) -> bool:
        return self.gate.paused and self.gate.in_flight == 0

    async def ack(self, *, force: bool = False) -> None:
        """Write this gateway's heartbeat row if its ack changed or its lease is due."""
        await self.heartbeat.beat(self._ack, force=force)

    def _ack(self) -> Ack:
        return Ack.of(self.applied, self.gate, self.engine.policy_version)

    # -- commands -------------------------------------------------------------------------------------
    async def command(
        self, *, paused: bool, policy_version: int | None = None, rewind: bool = False
    ) -> tuple[GateState, int]:
        """Commit a pause or resume, apply it here at once and ack it; (the gate, calls released)."""
        state = await anyio.to_thread.run_sync(
            lambda: self.store.command_gate(
                paused=paused, policy_version=policy_version, rewind=rewind, **self._gate_kwargs()
            )
        )
        self.apply(state)  # unless its own notification, arriving first, applied it already
        await self.ack()
        command, released = self._released
        return state, released if command == state.command else 0

    async def wait_drained(self, command: int, timeout: float) -> tuple[bool, GateState, list[GatewayRow]]:
        """Wait until every live gateway of this gate acked its current pause quiet, or ``timeout`` passed:
        (drained, the gate, the live gateways). ``Conflict`` once a resume overtook the pause."""

        return await self._wait_for(
            lambda row, state: not acked_quiet(row, state.command),
            timeout,
            check=lambda state: check_not_overtaken(command, state),
        )

    async def wait_applied(self, command: int, timeout: float) -> tuple[bool, GateState, list[GatewayRow]]:
        """Wait until every live gateway of this gate acked ``command`` (or a newer one), or ``timeout``
        passed: (all applied, the gate, the live gateways). What a resume waits for: it answered at its
        commit, while the other gateways applied it on their next look (SQLite: up to ``POLL_S``
        later), so a trainer that resumed and read a worker's ``/api/health`` or ``/api/state`` found
        it still paused. A newer command (a pause racing the resume) counts: it is no error here."""
        return await self._wait_for(lambda row, state: row.command < command, timeout)

    async def _wait_for(
        self,
        pending: Callable[[GatewayRow, GateState], bool],
        timeout: float,
        check: Callable[[GateState], None] | None = None,
    ) -> tuple[bool, GateState, list[GatewayRow]]:
        """Look at the gate and its live gateways until none is ``pending`` (given the gate read with
        it), or ``timeout`` passed: (none pending, the gate, the live gateways). ``check`` sees each
        gate read first (and may raise). Acks wake the wait (``_waiters``), else the next lease expiry
        or tick does."""
        self._waiters += 1
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while True:
                event = self._changed()
                await self.ack()
                state, rows = await anyio.to_thread.run_sync(self._of_gate(self.store.read_gate_and_gateways))
                self.apply(state)
                if check is not None:
                    check(state)
                now = self.clock()
                live = [self.fresh(r) for r in rows if r.live(now)]
                waiting = [r for r in live if pending(r, state)]
                remaining = deadline - loop.time()
                if not waiting or remaining <= 0:
                    return not waiting, state, live
                wait = next_look(waiting, now, remaining, self.tick_s)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), wait)
        finally:
            self._waiters -= 1

    async def members(self) -> tuple[GateState, list[GatewayRow]]:
        """This gate and its live gateways, as the store has them now."""
        state, rows = await anyio.to_thread.run_sync(self._of_gate(self.store.read_gate_and_gateways))
        now = self.clock()
        return state, [self.fresh(r) for r in rows if r.live(now)]

    def fresh(self, row: GatewayRow) -> GatewayRow:
        """``row`` with this gateway's own counts as they are now (its row is as of its last beat)."""
        if row.gateway_id != self.gateway_id:
            return row
        return with_counts(row, self.gate.in_flight, self.gate.waiting, self.quiet)
