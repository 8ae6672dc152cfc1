"""Separate gateway processes agreeing on pause and policy version through one PostgreSQL store.

Each gateway is its own process (``gate_node.py``: ``create_app`` served as the local stack serves
it, a scripted engine whose calls take a little while), knowing nothing of the others: a gateway
joining mid-run is paused with the others, a SIGKILLed one holds a pause no longer than its lease, a
restarted one comes back in the gate's state, racing pause/resume from two clients end in the state
of the last committed command (a property test over interleavings), and no call is answered while
the run is paused (checked by the policy versions the calls were recorded under).

Every wait is on a state (a gateway's ``/api/health``, the store's gate and heartbeat rows), bounded
by a generous deadline so a broken build fails instead of hanging.
"""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harnessrl.client import GatewayClient
from harnessrl.errors import Conflict
from harnessrl.store import open_store
from harnessrl.store.pg_server import PostgresServer

ADMIN_KEY = "test-admin-key"
NODE = Path(__file__).with_name("gate_node.py")
ROOT = Path(__file__).resolve().parents[2]
CHAT = {"model": "p", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def pg_url(pg_server: PostgresServer) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield pg_server.create_database(name)
    pg_server.drop_database(name)


@dataclass
class Node:
    proc: subprocess.Popen[str]
    url: str
    client: GatewayClient = field(init=False)

    def __post_init__(self) -> None:
        self.client = GatewayClient(self.url, ADMIN_KEY, timeout=120)

    def health(self) -> dict[str, Any]:
        """This process's own gate and policy version."""
        return httpx.get(f"{self.url}/api/health", timeout=30).json()


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


@pytest.fixture
def nodes(pg_url: str) -> Iterator[Callable[..., list[Node]]]:
    """``nodes(n, lease=, delay=)``: start ``n`` gateway processes on the test's database."""
    started: list[Node] = []

    def start(n: int = 1, *, lease: float = 10.0, delay: float = 0.02) -> list[Node]:
        procs = [
            subprocess.Popen(
                [sys.executable, str(NODE), pg_url, "--lease", str(lease), "--delay", str(delay)],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for _ in range(n)
        ]
        out = []
        for proc in procs:  # started together: their imports overlap
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("listening on "):
                    node = Node(proc, line.split()[-1])
                    threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep it drained
                    break
            else:
                raise AssertionError(f"gateway exited with {proc.wait()} before listening")
            started.append(node)
            out.append(node)
        return out

    yield start
    for node in started:
        node.client.close()
        if node.proc.poll() is None:
            node.proc.terminate()
    for node in started:
        node.proc.wait(timeout=60)


def call(node: Node, rollout: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{node.url}/rollouts/{rollout['rollout_id']}/v1/chat/completions",
        json=CHAT,
        headers={"Authorization": f"Bearer {rollout['api_key']}"},
        timeout=120,
    )


def own(node: Node) -> dict[str, Any]:
    (row,) = [g for g in node.client.state()["gateways"] if g["self"]]
    return row


def test_a_gateway_joining_mid_run_is_paused_with_the_others(nodes: Any, pg_url: str) -> None:
    a, b = nodes(2)
    paused = a.client.pause(timeout=60)
    assert paused["drained"] and len(paused["gateways"]) == 2
    (c,) = nodes(1)
    assert c.health()["paused"] is True  # read the gate before taking its first call
    rollout = c.client.create_rollout({})
    answers: list[httpx.Response] = []
    held = threading.Thread(target=lambda: answers.append(call(c, rollout)))
    held.start()
    wait_until(lambda: own(c)["waiting"] == 1, "the call waits at the new gateway's gate")
    again = b.client.pause(timeout=60)  # the trainer's next pause waits for all three
    ids = {g["gateway_id"] for g in paused["gateways"]}
    assert again["drained"] and ids < {g["gateway_id"] for g in again["gateways"]}
    assert len(again["gateways"]) == 3 and all(g["paused"] for g in again["gateways"])
    assert not answers
    resumed = c.client.resume(policy_version=4)
    assert resumed["live_policy_version"] == 4
    held.join(timeout=60)
    assert answers and answers[0].status_code == 200
    (recorded,) = c.client.list_calls(rollout["rollout_id"])
    assert recorded.policy_version == 4
    for node in (a, b, c):
        wait_until(lambda n=node: n.health()["paused"] is False, "every gateway opened")
        assert node.health()["policy_version"] == 4


def test_a_gateway_killed_during_a_pause_holds_it_no_longer_than_its_lease(nodes: Any) -> None:
    a, b = nodes(2, lease=2.0, delay=5.0)  # b's call takes many seconds; its lease is 2 s
    rollout = b.client.create_rollout({})

    def doomed() -> None:
        with contextlib.suppress(httpx.HTTPError):  # b is killed under it
            call(b, rollout)

    threading.Thread(target=doomed, daemon=True).start()
    wait_until(lambda: own(b)["in_flight"] == 1, "the call is in flight on b")
    b_id = own(b)["gateway_id"]
    answer: list[dict[str, Any]] = []
    pausing = threading.Thread(target=lambda: answer.append(a.client.pause(timeout=300)))
    pausing.start()
    # The pause waits on b: a acked it quiet, b acked it but still has its call in flight.
    wait_until(
        lambda: any(g["gateway_id"] == b_id and g["paused"] for g in a.client.state()["gateways"]),
        "b applied the pause",
    )
    assert not answer
    b.proc.send_signal(signal.SIGKILL)
    b.proc.wait(timeout=30)
    pausing.join(timeout=120)  # the lease ends; a pause of 300 s would fail the join
    assert answer, "the pause still waits for the killed gateway"
    assert answer[0]["drained"] is True
    assert [g["gateway_id"] for g in answer[0]["gateways"]] == [own(a)["gateway_id"]]
    a.client.resume()


def test_a_gateway_stalled_past_its_lease_records_no_call_it_was_generating(nodes: Any) -> None:
    """A stalled gateway (SIGSTOP here; a frozen VM, a blocked loop) is not waited for once its lease
    ends, so a pause counts the gateways drained without it and the trainer swaps weights. Woken,
    it must not record the call it was generating across that (the answer may mix two policies):
    the harness gets a 502 to retry, and the call is counted dropped (``gateway_lapsed``). It used
    to be recorded under the old version, seconds after the "drained" pause."""
    a, b = nodes(2, lease=2.0, delay=0.5)  # b's call takes ~2 s; its lease is 2 s
    rollout = b.client.create_rollout({})
    answers: list[httpx.Response] = []
    calling = threading.Thread(target=lambda: answers.append(call(b, rollout)))
    calling.start()
    wait_until(lambda: own(b)["in_flight"] == 1, "the call is in flight on b")
    b.proc.send_signal(signal.SIGSTOP)
    try:
        paused = a.client.pause(timeout=60)
        assert paused["drained"] and [g["gateway_id"] for g in paused["gateways"]] == [own(a)["gateway_id"]]
        a.client.resume(policy_version=1)  # the trainer updated the weights meanwhile
    finally:
        b.proc.send_signal(signal.SIGCONT)
    calling.join(timeout=60)
    assert answers and answers[0].status_code == 502, answers and answers[0].text
    assert "stalled past its lease" in answers[0].json()["error"]["message"]
    assert b.client.list_calls(rollout["rollout_id"]) == []
    assert (
        'harnessrl_calls_dropped_total{api="chat.completions",reason="gateway_lapsed"} 1.0'
        in b.client.metrics()
    )
    # Control: the same call on the same gateway, not stalled, is answered and recorded.
    wait_until(lambda: b.health()["policy_version"] == 1, "b adopted the resumed version")
    assert call(b, rollout).status_code == 200
    (recorded,) = b.client.list_calls(rollout["rollout_id"])
    assert recorded.policy_version == 1


def test_a_restarted_gateway_comes_back_in_the_gates_current_state(nodes: Any) -> None:
    a, b = nodes(2)
    a.client.pause(timeout=60)
    b.proc.terminate()
    assert b.proc.wait(timeout=60) == 0
    (b2,) = nodes(1)
    assert b2.health()["paused"] is True
    assert len(a.client.state()["gateways"]) == 2  # b left cleanly, b2 joined
    a.client.resume(policy_version=3)
    wait_until(lambda: b2.health()["paused"] is False, "the restarted gateway opened")
    assert b2.health()["policy_version"] == 3
    b2.proc.terminate()
    assert b2.proc.wait(timeout=60) == 0
    (b3,) = nodes(1)
    health = b3.health()
    assert health["paused"] is False and health["policy_version"] == 3  # the live version


def test_racing_pause_and_resume_end_in_the_last_committed_command(nodes: Any, pg_url: str) -> None:
    a, b = nodes(2)
    store = open_store(pg_url)

    def run(node: Node, commands: list[str], seen: list[tuple[int, str]]) -> None:
        for kind in commands:
            if kind == "pause":
                with contextlib.suppress(Conflict):  # a resume overtook it: not the last command then
                    seen.append((node.client.pause(timeout=60)["command"], kind))
            else:
                seen.append((node.client.resume()["command"], kind))

    commands = st.lists(st.sampled_from(["pause", "resume"]), min_size=1, max_size=4)

    @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
    @given(commands, commands)
    def race(one: list[str], two: list[str]) -> None:
        seen: list[tuple[int, str]] = []
        threads = [
            threading.Thread(target=run, args=(a, one, seen)),
            threading.Thread(target=run, args=(b, two, seen)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        last, kind = max(seen)
        gate = store.read_gate()
        assert gate.command == last and gate.paused is (kind == "pause")
        for node in (a, b):  # every gateway applies it (and acks it in its row)
            wait_until(lambda n=node: own(n)["command"] == last, "every gateway applied the last command")
            assert node.health()["paused"] is (kind == "pause")

    try:
        race()
    finally:
        store.close()


def test_no_call_is_answered_while_the_run_is_paused(nodes: Any, pg_url: str) -> None:
    gateways = nodes(3, delay=0.01)
    store = open_store(pg_url)
    stop = threading.Event()
    rollouts = [gateways[0].client.create_rollout({}) for _ in range(4)]
    errors: list[str] = []

    def agent(k: int) -> None:
        i = k
        while not stop.is_set():
            targets = list(gateways)
            response = call(targets[i % len(targets)], rollouts[k])
            if response.status_code != 200:
                errors.append(response.text)
            i += 1

    agents = [threading.Thread(target=agent, args=(k,), daemon=True) for k in range(4)]
    for t in agents:
        t.start()
    pick = random.Random(0)
    recorded_at_pause: list[int] = []  # calls recorded when the pause of version v drained
    try:
        for version in range(1, 5):
            wait_until(
                lambda: store.count_calls() >= (recorded_at_pause[-1] if recorded_at_pause else 0) + 8,
                "the agents made calls",
            )
            answer = pick.choice(gateways).client.pause(timeout=60)
            assert answer["drained"], answer
            recorded_at_pause.append(store.count_calls())
            if version == 2:
                gateways += nodes(1, delay=0.01)  # joins paused; the agents use it from now on
            # Calls reach the gates and wait there; none is answered (nor recorded) while paused.
            wait_until(lambda f=gateways[0]: f.client.state()["waiting"] >= 2, "calls wait at the gates")
            assert store.count_calls() == recorded_at_pause[-1]
            pick.choice(gateways).client.resume(policy_version=version)
        wait_until(lambda: store.count_calls() >= recorded_at_pause[-1] + 8, "calls under the last version")
        final = pick.choice(gateways).client.pause(timeout=60)
        assert final["drained"] and len(final["gateways"]) == 4
        recorded_at_pause.append(store.count_calls())
    finally:
        stop.set()  # the calls held now are answered under version 5
        gateways[0].client.resume(policy_version=5)
        for t in agents:
            t.join(timeout=60)
    assert not errors
    versions = Counter(c.policy_version for r in rollouts for c in store.list_calls(r["rollout_id"]))
    # Each call carries the version live when it was admitted: calls between two pauses are exactly
    # those of the version resumed in between; a call answered while paused would break the counts.
    expected = {0: recorded_at_pause[0]} | {
        v: recorded_at_pause[v] - recorded_at_pause[v - 1] for v in range(1, 5)
    }
    assert {v: versions[v] for v in range(5)} == expected
    assert set(versions) <= {0, 1, 2, 3, 4, 5}
    store.close()
