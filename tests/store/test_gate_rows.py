"""The gate's rows (``store.gate``) on every backend: one ordered command counter, versions that
never go backwards unless rewound, heartbeat rows, and (PostgreSQL) a notification per change."""

from __future__ import annotations

import queue
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.store.conftest import StoreFactory

from harnessrl.errors import Conflict
from harnessrl.store.base import Store
from harnessrl.store.gate import GateState, GatewayRow, command_payload, parse_command_payload


def row(gateway_id: str, command: int, *, quiet: bool = True, lease_s: float = 10.0) -> GatewayRow:
    now = time.time()
    return GatewayRow(gateway_id, "", command, True, quiet, 0, 0, 0, now + lease_s, now)


def test_a_fresh_store_has_an_open_gate_and_commands_count_up(store: Store) -> None:
    assert store.read_gate() == GateState(paused=False, policy_version=None, command=0)
    assert store.command_gate(paused=True) == GateState(True, None, 1)
    assert store.command_gate(paused=False, policy_version=3) == GateState(False, 3, 2)
    assert store.command_gate(paused=True) == GateState(True, 3, 3)  # the version stays
    assert store.read_gate() == GateState(True, 3, 3)


def test_a_version_never_goes_backwards_unless_rewound(store: Store) -> None:
    store.command_gate(paused=False, policy_version=5)
    with pytest.raises(Conflict, match="never go backwards"):
        store.command_gate(paused=False, policy_version=4)
    assert store.read_gate() == GateState(False, 5, 1)  # nothing changed
    assert store.command_gate(paused=False, policy_version=5).command == 2  # the same again: fine
    assert store.command_gate(paused=False, policy_version=4, rewind=True) == GateState(False, 4, 3)


def test_heartbeat_rows_are_upserted_and_removed(store: Store) -> None:
    store.beat(row("a", 1, quiet=False), notify=True)
    store.beat(row("b", 0), notify=False)
    store.beat(row("a", 2), notify=True)
    rows = {r.gateway_id: r for r in store.list_gateways()}
    assert set(rows) == {"a", "b"} and rows["a"].command == 2 and rows["a"].quiet
    assert all(r.live(time.time()) for r in rows.values())
    store.beat(row("b", 0, lease_s=-1.0), notify=False)
    assert not {r.gateway_id: r for r in store.list_gateways()}["b"].live(time.time())
    store.leave_gate("a")
    assert [r.gateway_id for r in store.list_gateways()] == ["b"]


def test_concurrent_commands_get_distinct_consecutive_numbers(shared_store_factory: StoreFactory) -> None:
    stores = [shared_store_factory() for _ in range(4)]
    seen: list[int] = []
    lock = threading.Lock()

    def commands(store: Store, paused: bool) -> None:
        for _ in range(10):
            number = store.command_gate(paused=paused).command
            with lock:
                seen.append(number)

    threads = [threading.Thread(target=commands, args=(s, i % 2 == 0)) for i, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == list(range(1, 41))
    assert stores[0].read_gate().command == 40


def test_postgres_notifies_every_change(store: Store) -> None:
    if not store.notifies_gate:
        assert store.watch_gate(lambda payload: None) is None  # SQLite: the caller polls
        return
    payloads: queue.Queue[str] = queue.Queue()
    stop = store.watch_gate(payloads.put)
    assert stop is not None
    try:
        assert payloads.get(timeout=30) == ""  # listening
        store.command_gate(paused=True)
        assert parse_command_payload(payloads.get(timeout=30)) == GateState(True, None, 1)
        store.command_gate(paused=False, policy_version=7)
        assert payloads.get(timeout=30) == "command 2 open 7"
        store.beat(row("a", 1), notify=True)
        assert payloads.get(timeout=30) == "ack a"
        store.beat(row("a", 1), notify=False)  # a lease refreshed: nobody woken
        store.leave_gate("a")
        assert payloads.get(timeout=30) == "leave a"
    finally:
        stop()


@given(st.booleans(), st.none() | st.integers(0, 2**63 - 1), st.integers(1, 2**63 - 1))
def test_a_command_notification_carries_its_state_exactly(paused: bool, version: int | None, n: int) -> None:
    state = GateState(paused=paused, policy_version=version, command=n)
    assert parse_command_payload(command_payload(state)) == state
    assert parse_command_payload("ack gw-1") is None and parse_command_payload("") is None
