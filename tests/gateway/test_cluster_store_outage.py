"""A gateway whose store refuses its heartbeat writes retries at a bounded pace (``gateway.control.cluster``).

A real ``Cluster`` on a real SQLite file; the file then refuses every new heartbeat row as a full
disk refuses writes (a trigger raising SQLite's own "database or disk is full", added from another
connection, as a full disk hits every process at once). The beat's time does not move on while its
write fails, so the sync loop used to try again at once, thousands of times a second: a core and
the event loop the calls share, for as long as the outage lasted.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.gateway.control.cluster import Cluster
from harnessrl.gateway.control.pause import PauseGate
from harnessrl.store.gate import GatewayRow
from harnessrl.store.sqlite import SQLiteStore

#: The least time between two failed tries that the gateway's pace (``cluster.RETRY_S``, 50 ms) allows.
MIN_GAP_S = 0.04


class WatchedBeats(SQLiteStore):
    """A real store on the file that notes when each heartbeat write is tried."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.tries: list[float] = []

    def beat(self, row: GatewayRow, *, notify: bool) -> None:
        self.tries.append(time.monotonic())
        super().beat(row, notify=notify)


def _fill_the_disk(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TRIGGER disk_full BEFORE INSERT ON gateways "
            "BEGIN SELECT RAISE(FAIL, 'database or disk is full'); END"
        )


def _free_the_disk(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER IF EXISTS disk_full")


async def _tries_while_full(path: Path, count: int) -> list[float]:
    """When the heartbeat writes were tried, ``count`` of them, once the disk was full."""
    store = WatchedBeats(path)
    # A short lease: its beat is due every 0.1 s, so the outage is met at once.
    cluster = Cluster(store, PauseGate(), ScriptedEngine(["x"]), shared=True, lease_s=0.3)
    await cluster.start()
    try:
        _fill_the_disk(path)
        full_from = len(store.tries)
        deadline = time.monotonic() + 60
        while len(store.tries) < full_from + count:
            assert time.monotonic() < deadline, "the gateway stopped trying to write its heartbeat"
            await asyncio.sleep(0.01)
        return store.tries[full_from : full_from + count]
    finally:
        _free_the_disk(path)
        await cluster.stop()
        store.close()


def test_failing_heartbeat_writes_are_retried_at_a_bounded_pace(tmp_path: Path) -> None:
    tries = asyncio.run(_tries_while_full(tmp_path / "store.db", 6))
    gaps = [later - earlier for earlier, later in zip(tries, tries[1:], strict=False)]
    # Each failed try waits before the next (a lower bound only: a loaded machine waits longer).
    assert min(gaps) >= MIN_GAP_S, [round(g, 4) for g in gaps]


def test_control_the_heartbeat_is_written_again_once_the_disk_has_room(tmp_path: Path) -> None:
    """The pause between tries does not stop them: the row is written again after the outage."""
    path = tmp_path / "store.db"

    async def recovers() -> bool:
        store = SQLiteStore(path)
        cluster = Cluster(store, PauseGate(), ScriptedEngine(["x"]), shared=True, lease_s=0.3)
        await cluster.start()
        try:
            _fill_the_disk(path)
            written = cluster.heartbeat.lease_until
            deadline = time.monotonic() + 60
            while time.time() < written:  # the lease ran out meanwhile (``Cluster``'s clock)
                await asyncio.sleep(0.05)
            _free_the_disk(path)
            while cluster.heartbeat.lease_until == written:
                assert time.monotonic() < deadline, "the heartbeat was never written again"
                await asyncio.sleep(0.01)
            return any(row.gateway_id == cluster.gateway_id for row in store.list_gateways())
        finally:
            _free_the_disk(path)
            await cluster.stop()
            store.close()

    assert asyncio.run(recovers())
