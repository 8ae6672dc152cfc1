"""Two runs sharing one store keep their own gates (``gateway.gate``, ``gateway.control.cluster``).

Real gateways (uvicorn on 127.0.0.1, scripted engines), each with its own store object on the same
database (a SQLite file, and a real PostgreSQL: the throwaway server of ``harnessrl.store.pg_server``,
skipped without it, failed in CI), as separate processes of two runs have. Run A's gateway serves
under the gate ``run-a``, run B's under ``run-b``. The store used to hold one gate: B's start or
resume reopened A's gateways in the middle of A's weight update, A's resume announced its policy
version to B's gateways, and A's pause waited for B's busy gateway. The control: two gateways of
the same gate still pause, drain and resume together.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store import open_store
from harnessrl.store.base import Store
from harnessrl.store.pg_server import PostgresServer
from harnessrl.tokenizer import PolicyTokenizer

ADMIN_KEY = "test-admin-key"
WAIT_S = 60.0  # ends a hung test only; every wait below is for a state
SLOW = ["a slow answer " * 8]  # with token_delay_s=0.1: seconds of generation, long enough to see


@pytest.fixture(params=["sqlite-file", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite-file":
        yield f"sqlite:///{tmp_path / 'shared.db'}"
        return
    server: PostgresServer = request.getfixturevalue("pg_server")
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield server.create_database(name)
    server.drop_database(name)


@dataclass
class Node:
    url: str
    client: GatewayClient
    store: Store
    engine: ScriptedEngine

    def state(self) -> dict[str, Any]:
        return self.client.state()

    def own(self) -> dict[str, Any]:
        """This gateway's own row as ``/api/state`` lists it (its counts as they are now)."""
        (own,) = [g for g in self.state()["gateways"] if g["self"]]
        return own


@pytest.fixture
def make_node(tokenizer: PolicyTokenizer, store_url: str) -> Iterator[Callable[..., Node]]:
    """``make_node(gate, turns=..., token_delay_s=...)``: a gateway on the shared store under ``gate``."""
    stack = contextlib.ExitStack()

    def make(gate: str, turns: Any = ("Hello!",), *, token_delay_s: float = 0.0) -> Node:
        store = open_store(store_url)
        stack.callback(store.close)
        engine = ScriptedEngine(list(turns), tokenizer, token_delay_s=token_delay_s)
        # The lease outlasts a loaded machine's stalls: no gateway may count as gone mid-test.
        app = create_app(GatewayConfig(admin_key=ADMIN_KEY, gate=gate, lease_s=60.0), store, engine)
        url = stack.enter_context(serve_in_thread(app))
        client = GatewayClient(url, ADMIN_KEY)
        stack.callback(client.close)
        return Node(url=url, client=client, store=store, engine=engine)

    with stack:
        yield make


def _ask(node: Node, rollout: dict[str, Any], text: str = "hi") -> str:
    sdk = openai.OpenAI(
        base_url=f"{node.url}/rollouts/{rollout['rollout_id']}/v1",
        api_key=rollout["api_key"],
        max_retries=0,
        timeout=WAIT_S,
    )
    answer = sdk.chat.completions.create(model="policy", messages=[{"role": "user", "content": text}])
    return answer.choices[0].message.content or ""


def _in_background(node: Node, rollout: dict[str, Any], out: dict[str, Any]) -> threading.Thread:
    def run() -> None:
        try:
            out["answer"] = _ask(node, rollout)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _until(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def test_pausing_one_run_leaves_the_other_serving_and_its_resume_does_not_reopen_it(
    make_node: Callable[..., Node],
) -> None:
    a, b = make_node("run-a"), make_node("run-b")
    paused = a.client.pause(timeout=WAIT_S)
    assert paused["drained"] is True
    assert [g["gateway_id"] for g in paused["gateways"]] == [a.state()["gateway_id"]]
    # The pause drained A's gateways, so every gateway it counted applied it: B was not one of them.
    assert b.state()["paused"] is False and b.own()["paused"] is False
    assert _ask(b, b.client.create_rollout({})) == "Hello!"  # a real call through B, A paused

    # A call through A is held while B pauses and resumes (B's run publishing its weights).
    held: dict[str, Any] = {}
    rollout_a = a.client.create_rollout({})
    thread = _in_background(a, rollout_a, held)
    _until("A's call waits at its gate", lambda: a.own()["waiting"] == 1)
    assert b.client.pause(timeout=WAIT_S)["drained"] is True
    assert b.client.resume(policy_version=0, rewind=True)["paused"] is False  # as ``announce_start``
    assert a.state()["paused"] is True and a.store.read_gate("run-a").paused
    assert a.own()["waiting"] == 1 and not held
    assert a.client.resume(policy_version=7)["released"] == 1
    thread.join(WAIT_S)
    assert held == {"answer": "Hello!"}
    # A's version labels A's calls only: B still serves (and records) version 0.
    assert [c.policy_version for c in a.store.list_calls(rollout_a["rollout_id"])] == [7]
    rollout_b = b.client.create_rollout({})
    assert _ask(b, rollout_b) == "Hello!"
    assert [c.policy_version for c in b.store.list_calls(rollout_b["rollout_id"])] == [0]
    assert b.state()["live_policy_version"] == 0 and a.state()["live_policy_version"] == 7
    assert (a.state()["gate"], b.state()["gate"]) == ("run-a", "run-b")  # each names its gate


def test_a_drain_of_one_run_ignores_the_other_runs_busy_gateway(make_node: Callable[..., Node]) -> None:
    a, b = make_node("run-a"), make_node("run-b", SLOW, token_delay_s=0.1)
    busy: dict[str, Any] = {}
    rollout_b = b.client.create_rollout({})
    thread = _in_background(b, rollout_b, busy)
    _until("B's call generates", lambda: b.own()["in_flight"] == 1)
    paused = a.client.pause(timeout=WAIT_S)
    # Drained over A's gateways only: B's call neither counted nor waited for, B not paused.
    assert paused["drained"] is True and paused["in_flight"] == 0
    assert [g["gateway_id"] for g in paused["gateways"]] == [a.state()["gateway_id"]]
    assert b.state()["paused"] is False
    thread.join(WAIT_S)
    assert "answer" in busy, busy
    assert len(b.store.list_calls(rollout_b["rollout_id"])) == 1
    a.client.resume()


def test_two_gateways_of_the_same_gate_still_pause_drain_and_resume_together(
    make_node: Callable[..., Node],
) -> None:
    """The control: named gates change nothing among the gateways of one gate."""
    a1, a2 = make_node("run-a"), make_node("run-a", SLOW, token_delay_s=0.1)
    make_node("run-b")  # another run's gateway on the store: neither listed nor waited for
    busy: dict[str, Any] = {}
    rollout = a2.client.create_rollout({})
    thread = _in_background(a2, rollout, busy)
    _until("the call generates on the second gateway", lambda: a2.own()["in_flight"] == 1)
    paused = a1.client.pause(timeout=WAIT_S)
    assert paused["drained"] is True
    ids = {a1.state()["gateway_id"], a2.state()["gateway_id"]}
    assert {g["gateway_id"] for g in paused["gateways"]} == ids and len(paused["gateways"]) == 2
    assert all(g["paused"] and g["drained"] for g in paused["gateways"])
    # Drained means the call on the other gateway of the gate is recorded.
    assert len(a1.store.list_calls(rollout["rollout_id"])) == 1
    thread.join(WAIT_S)
    # A new call through the second gateway waits for the resume through the first.
    held: dict[str, Any] = {}
    thread = _in_background(a2, a2.client.create_rollout({}), held)
    _until("the new call waits at the second gateway", lambda: a2.own()["waiting"] == 1)
    assert not held
    a1.client.resume()
    thread.join(WAIT_S)
    assert "answer" in held, held


def test_another_gates_commands_are_ignored_in_order(store_url: str, tokenizer: PolicyTokenizer) -> None:
    """One gateway's ``Cluster`` (gate ``run-b``) while another store commits to ``run-a`` and
    ``run-b`` in turn. PostgreSQL delivers each commit's notification, in commit order, to every
    listener: run-a's are ignored (its counter is not ours: applying its command 3 would make
    run-b's command 2 look old and be skipped, leaving this gateway paused; its version would
    label our calls). SQLite: the gateway reads its own gate's row."""
    from harnessrl.gateway.control.cluster import Cluster
    from harnessrl.gateway.control.pause import PauseGate

    async def scenario() -> tuple[int, bool, int]:
        other, mine = open_store(store_url), open_store(store_url)
        engine = ScriptedEngine(["x"], tokenizer)
        cluster = Cluster(mine, PauseGate(), engine, shared=True, lease_s=60.0, gate_name="run-b")
        await cluster.start()
        try:

            async def until(what: str, check: Callable[[], bool]) -> None:
                deadline = time.monotonic() + WAIT_S
                while not check():
                    assert time.monotonic() < deadline, f"never: {what}"
                    await asyncio.sleep(0.02)

            await asyncio.to_thread(other.command_gate, paused=True, policy_version=9, gate="run-a")
            await asyncio.to_thread(other.command_gate, paused=True, gate="run-b")
            await until("run-b's pause applied", lambda: cluster.applied == 1 and cluster.gate.paused)
            for _ in range(2):
                await asyncio.to_thread(other.command_gate, paused=True, gate="run-a")
            await asyncio.to_thread(other.command_gate, paused=False, gate="run-b")
            await until("run-b's resume applied", lambda: not cluster.gate.paused)
            return cluster.applied, cluster.gate.paused, engine.policy_version
        finally:
            await cluster.stop()
            other.close()
            mine.close()

    assert asyncio.run(scenario()) == (2, False, 0)


def test_a_trainer_finds_a_gateway_of_a_named_gate_on_its_store(
    make_node: Callable[..., Node], store_url: str, tmp_path: Path
) -> None:
    """``trainer.gateway_url`` at a gateway serving the gate ``run-a``: the trainer's check that the
    gateway uses the run's store looks among that gate's gateways (``/api/state`` names it), so it
    passes; the control, a gateway on another store, is still refused."""
    from harnessrl.errors import ConfigError
    from harnessrl.trainer.fleet_remote import check_same_store

    a = make_node("run-a")
    run_store = open_store(store_url)
    elsewhere = open_store(f"sqlite:///{tmp_path / 'elsewhere.db'}")
    try:
        state = a.state()
        assert state["gate"] == "run-a"
        check_same_store(state, run_store, a.url, store_url)
        with pytest.raises(ConfigError, match="does not use the run's store"):
            check_same_store(state, elsewhere, a.url, "elsewhere.db")
    finally:
        run_store.close()
        elsewhere.close()
