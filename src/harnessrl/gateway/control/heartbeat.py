"""One gateway's heartbeat row in the store: who it is, what it acked, and its lease.

Each gateway process keeps one row among the store's gateways (``store.gate``): its id (host,
process, a random suffix), the gate it serves under (``gateway.gate``), where it answers, the pause/resume command it applied, whether it is
quiet (paused, no call in flight), and until when its lease runs. ``Heartbeat`` writes the row when
the ack changes or every third of the lease, and deletes it on a clean shutdown; ``gateway.control.cluster``
decides what is acked.

**The fence.** A pause stops waiting for a gateway whose lease ended: it may be dead. It may also be
alive but stalled (SIGSTOP, a frozen VM, a loop blocked past the lease), and then wake with a call
in flight that a trainer, told the gateways were drained, has since swapped weights under. So a
gateway counts itself *lapsed* once two thirds of its lease passed without a renewal (a third
before anyone else may count it gone: room for their clocks to run ahead of its own), and each
renewal that comes after such a lapse counts one (``lapses``); a call that was generating across a
lapse is not recorded (``pipeline.calls``).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio.to_thread

from harnessrl.gateway.control.pause import PauseGate
from harnessrl.store.base import Store
from harnessrl.store.gate import DEFAULT_GATE, GatewayRow, check_gate


@dataclass(frozen=True)
class Ack:
    """What a gateway reports in its row: the command it applied, and its gate and engine now."""

    command: int
    paused: bool
    quiet: bool
    in_flight: int
    waiting: int
    policy_version: int

    @classmethod
    def of(cls, command: int, gate: PauseGate, policy_version: int) -> Ack:
        """The ack of ``command`` with ``gate`` as it is now (quiet: paused, no call in flight)."""
        quiet = gate.paused and gate.in_flight == 0
        return cls(command, gate.paused, quiet, gate.in_flight, gate.waiting, policy_version)


class Heartbeat:
    """This gateway's row among the store's gateways."""

    def __init__(
        self,
        store: Store,
        *,
        lease_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        gate: str = DEFAULT_GATE,
    ) -> None:
        check_gate(gate)
        self.store = store
        self.gate = gate  # the gate this gateway's row is under
        self.lease_s = lease_s
        self.clock = clock
        self.gateway_id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.url = ""  # where this gateway answers, for /api/state (informational)
        self.started_at = clock()
        self.next_beat = 0.0  # when the lease is next due for a refresh
        self.lease_until = 0.0  # the lease as last written (0: not registered yet)
        self.lapses = 0  # renewals that came after the lease had lapsed (``lapsed``)
        self._acked: tuple[int, bool, bool] | None = None  # (command, paused, quiet) as last written
        self._lock: asyncio.Lock | None = None

    async def beat(self, ack: Callable[[], Ack], *, force: bool = False) -> None:
        """Write the row if ``ack()`` changed or the lease is due. ``ack`` is read under the lock, so
        the last write is always of the state as it was then."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # two writes in threads could commit out of order
            now_acked = ack()
            key = (now_acked.command, now_acked.paused, now_acked.quiet)
            now = self.clock()
            if key == self._acked and now < self.next_beat and not force:
                return
            row = GatewayRow(
                gateway_id=self.gateway_id,
                url=self.url,
                command=now_acked.command,
                paused=now_acked.paused,
                quiet=now_acked.quiet,
                in_flight=now_acked.in_flight,
                waiting=now_acked.waiting,
                policy_version=now_acked.policy_version,
                lease_until=now + self.lease_s,
                started_at=self.started_at,
                gate=self.gate,
            )
            changed = key != self._acked
            await anyio.to_thread.run_sync(lambda: self.store.beat(row, notify=changed))
            if self.lapsed(now):
                self.lapses += 1
            self._acked, self.next_beat, self.lease_until = key, now + self.lease_s / 3, row.lease_until

    def lapsed(self, now: float) -> bool:
        """Whether the lease as last written had run into its last third at ``now``: others may
        count this gateway gone soon, or (their clocks ahead) already."""
        return self.lease_until > 0 and now >= self.lease_until - self.lease_s / 3

    async def leave(self) -> None:
        """Delete the row (a clean shutdown: no pause waits for this gateway any more)."""
        if self.gate == DEFAULT_GATE:  # named as before gates had names (``Cluster._of_gate``)
            await anyio.to_thread.run_sync(self.store.leave_gate, self.gateway_id)
        else:
            await anyio.to_thread.run_sync(self.store.leave_gate, self.gateway_id, self.gate)
