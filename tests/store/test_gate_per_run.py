"""One gate per name, not one per store (``store.gate``): two runs sharing a store keep their own.

Every backend (``conftest``): a command on one gate leaves the others as they were, a gate's
versions are its own, each gate lists only its gateways, PostgreSQL's notifications name their
gate, and a store of schema 8 (one gate row, no gate column) migrates with its gate and gateways
kept as the gate ``default``.
"""

from __future__ import annotations

import queue
import time

import pytest
from tests.store.conftest import StoreFactory
from tests.store.test_migrations import insert, migrate_raw, raw_connection, stored_version

from harnessrl.errors import BadRequest
from harnessrl.store import Store, open_store
from harnessrl.store.gate import (
    DEFAULT_GATE,
    GateState,
    GatewayRow,
    command_payload,
    parse_command_payload,
    payload_gate,
)


def row(gateway_id: str, gate: str, command: int = 0) -> GatewayRow:
    now = time.time()
    return GatewayRow(gateway_id, "", command, True, True, 0, 0, 0, now + 30.0, now, gate=gate)


def test_a_command_changes_its_own_gate_only(store: Store) -> None:
    store.command_gate(paused=True, gate="run-a")
    assert store.read_gate("run-a") == GateState(True, None, 1)
    assert store.read_gate("run-b") == GateState(False, None, 0)  # never commanded: open
    assert store.read_gate() == GateState(False, None, 0)  # the default gate too
    # Run B's start announces version 0 (as ``announce_start`` does): A's gate stays paused, its
    # version and counter untouched.
    store.command_gate(paused=False, policy_version=5, gate="run-a")
    assert store.command_gate(paused=False, policy_version=0, gate="run-b") == GateState(False, 0, 1)
    store.command_gate(paused=True, gate="run-a")
    assert store.command_gate(paused=False, gate="run-b") == GateState(False, 0, 2)
    assert store.read_gate("run-a") == GateState(True, 5, 3)


def test_each_gate_lists_its_own_gateways(store: Store) -> None:
    store.beat(row("a1", "run-a"), notify=True)
    store.beat(row("a2", "run-a"), notify=False)
    store.beat(row("b1", "run-b"), notify=True)
    store.beat(row("d1", DEFAULT_GATE), notify=True)
    assert [r.gateway_id for r in store.list_gateways("run-a")] == ["a1", "a2"]
    assert [(r.gateway_id, r.gate) for r in store.list_gateways("run-b")] == [("b1", "run-b")]
    assert [r.gateway_id for r in store.list_gateways()] == ["d1"]
    store.command_gate(paused=True, gate="run-a")
    gate, rows = store.read_gate_and_gateways("run-a")
    assert gate.paused and [r.gateway_id for r in rows] == ["a1", "a2"]
    store.leave_gate("a1", "run-a")
    assert [r.gateway_id for r in store.list_gateways("run-a")] == ["a2"]


@pytest.mark.parametrize("name", ["", "a b", "x" * 201, "a\x00", "ü"])
def test_a_gate_name_outside_the_pattern_is_refused(store: Store, name: str) -> None:
    with pytest.raises(BadRequest, match="gate must be"):
        store.command_gate(paused=True, gate=name)
    with pytest.raises(BadRequest, match="gate must be"):
        store.read_gate(name)
    assert store.read_gate() == GateState(False, None, 0)


def test_notifications_name_their_gate(store: Store) -> None:
    if not store.notifies_gate:
        pytest.skip("SQLite cannot notify (gateways poll their own gate's row)")
    payloads: queue.Queue[str] = queue.Queue()
    stop = store.watch_gate(payloads.put)
    assert stop is not None
    try:
        assert payloads.get(timeout=30) == ""
        store.command_gate(paused=True, gate="run-a")
        got = payloads.get(timeout=30)
        assert payload_gate(got) == "run-a" and parse_command_payload(got) == GateState(True, None, 1)
        store.command_gate(paused=True)
        got = payloads.get(timeout=30)
        assert got == "command 1 paused -" and payload_gate(got) == DEFAULT_GATE
        store.beat(row("b1", "run-b"), notify=True)
        assert payload_gate(payloads.get(timeout=30)) == "run-b"
        store.leave_gate("b1", "run-b")
        assert payload_gate(payloads.get(timeout=30)) == "run-b"
    finally:
        stop()


def test_payload_gate_reads_every_shape() -> None:
    state = GateState(paused=False, policy_version=3, command=9)
    assert payload_gate(command_payload(state, "run-a")) == "run-a"
    assert parse_command_payload(command_payload(state, "run-a")) == state
    assert payload_gate(command_payload(state)) == DEFAULT_GATE
    assert payload_gate("ack gw-1") == DEFAULT_GATE and payload_gate("ack gw-1 run-b") == "run-b"
    assert payload_gate("leave gw-1 run-b") == "run-b"
    assert payload_gate("") is None and payload_gate("something else entirely") is None


def test_a_schema_8_store_migrates_its_gate_and_gateways(shared_store_factory: StoreFactory) -> None:
    """A store of the one-gate schema (8), paused at command 5 with version 3 and one gateway's row,
    opens with that state as the gate ``default`` and keeps working; other gates start fresh."""
    url = shared_store_factory.url
    with raw_connection(url) as (conn, mark):
        migrate_raw(conn, mark, target=8)
        conn.execute("UPDATE gate SET paused = 1, policy_version = 3, command = 5 WHERE id = 1")
        now = time.time()
        insert(
            conn,
            mark,
            "gateways",
            {
                "gateway_id": "old-gw",
                "url": "http://127.0.0.1:1",
                "command": 5,
                "paused": 1,
                "quiet": 1,
                "in_flight": 0,
                "waiting": 2,
                "policy_version": 3,
                "lease_until": now + 60,
                "started_at": now,
            },
        )
    assert stored_version(url) == 8
    store = open_store(url)
    try:
        assert stored_version(url) == 9
        assert store.read_gate() == GateState(True, 3, 5)
        (old,) = store.list_gateways()
        assert (old.gateway_id, old.gate, old.command, old.waiting) == ("old-gw", DEFAULT_GATE, 5, 2)
        assert store.list_gateways("run-a") == []
        # It keeps working: the default gate counts on, versions still never go backwards there,
        # and a new gate starts from command 1.
        assert store.command_gate(paused=False, policy_version=4) == GateState(False, 4, 6)
        assert store.command_gate(paused=True, gate="run-a") == GateState(True, None, 1)
        store.beat(row("new-gw", "run-a", command=1), notify=True)
        assert [r.gateway_id for r in store.list_gateways("run-a")] == ["new-gw"]
    finally:
        store.close()
