"""A gateway that joins while a pause is being committed is waited for (``gateway.control.cluster``).

Two gateways' ``Cluster``s on one SQLite file (each with its own store object, as two processes
have). The joining one's first heartbeat write is held (a store that waits there until let go), so
the pause commits and is waited on exactly between the joiner's steps: the interleaving a busy
host produces by chance. The gateway used to read the gate first and register after: a pause
committed between the two was answered ``drained`` without it, and it then opened with the gate as
read and admitted calls while the trainer, told the gateways were quiet, swapped weights.

Also: ``/metrics`` names every reason a call is dropped for.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, get_args

from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.gateway.control.cluster import Cluster
from harnessrl.gateway.control.pause import PauseGate
from harnessrl.gateway.metrics import GatewayMetrics
from harnessrl.gateway.pipeline.delivery import DropReason
from harnessrl.store.gate import GatewayRow
from harnessrl.store.sqlite import SQLiteStore


class HeldFirstBeat(SQLiteStore):
    """A real store on the file whose first heartbeat write waits until ``go`` is set."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.entered = threading.Event()
        self.go = threading.Event()
        self._first = True

    @property
    def reads_at_once(self) -> bool:  # reads in a thread, as on PostgreSQL: the loop stays free
        return False

    def beat(self, row: GatewayRow, *, notify: bool) -> None:
        if self._first:
            self._first = False
            self.entered.set()
            assert self.go.wait(60), "the test never let the write go"
        super().beat(row, notify=notify)


def _cluster(store: SQLiteStore, gate: PauseGate) -> Cluster:
    return Cluster(store, gate, ScriptedEngine(["x"]), shared=True, lease_s=30.0)


async def _joined_during_a_pause(tmp_path: Path, *, let_go_first: bool) -> dict[str, Any]:
    """Pause through A while B's first heartbeat write is held; ``let_go_first``: let the write go
    before waiting for the drain, else only once the pause answered (B had no row then)."""
    path = tmp_path / "store.db"
    store_a, store_b = SQLiteStore(path), HeldFirstBeat(path)
    gate_b = PauseGate()
    a, b = _cluster(store_a, PauseGate()), _cluster(store_b, gate_b)
    await a.start()
    joining = asyncio.create_task(b.start())
    try:
        await asyncio.to_thread(store_b.entered.wait, 60)
        gate, _ = await a.command(paused=True)
        if let_go_first:
            store_b.go.set()
        drained, _, _ = await a.wait_drained(gate.command, 60.0)
        store_b.go.set()
        await asyncio.wait_for(joining, 60)
        ticket = gate_b.join()  # a call arriving at the joiner now
        admitted = ticket.admitted
        ticket.release()
        return {"drained": drained, "admitted": admitted, "b_paused": gate_b.paused}
    finally:
        store_b.go.set()
        if not joining.done():
            await joining
        await a.stop()
        await b.stop()
        store_a.close()
        store_b.close()


def test_a_pause_answered_drained_holds_a_gateway_that_was_joining(tmp_path: Path) -> None:
    result = asyncio.run(_joined_during_a_pause(tmp_path, let_go_first=False))
    assert result["drained"], result  # B had not registered: nothing to wait for ...
    assert not result["admitted"] and result["b_paused"], f"... so B must come up paused: {result}"


def test_control_a_joiner_let_go_during_the_drain_is_waited_for_and_paused(tmp_path: Path) -> None:
    result = asyncio.run(_joined_during_a_pause(tmp_path, let_go_first=True))
    assert result["drained"] and result["b_paused"] and not result["admitted"], result


def test_the_dropped_calls_help_names_every_drop_reason() -> None:
    """``/metrics`` explains ``harnessrl_calls_dropped_total``'s reasons: every one a call can be
    dropped for (``gateway_stopping`` was missing)."""
    text = GatewayMetrics().render().decode()
    (help_line,) = [
        line for line in text.splitlines() if line.startswith("# HELP harnessrl_calls_dropped_total")
    ]
    missing = [reason for reason in get_args(DropReason) if reason not in help_line]
    assert not missing, help_line
