"""Several gateways sharing one PostgreSQL store (``gateway.cluster``, ``gateway.workers``).

Two real gateways (uvicorn on 127.0.0.1, each with its own ``PostgresStore`` connection pool on the
same database and its own scripted engine) told about each other as siblings; an OpenAI-SDK agent
loop whose consecutive calls alternate between them; pause through one while a call is in flight
on the other. The last tests start ``python -m harnessrl.gateway --workers 2`` as a real process.

PostgreSQL: the throwaway server of ``harnessrl.store.pg_server`` (skipped without it, failed in CI).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.errors import UpstreamError
from harnessrl.gateway import create_app
from harnessrl.gateway.cluster import Cluster, aggregate
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store import open_store
from harnessrl.store.pg_server import PostgresServer, PostgresUnavailable, server_for_tests
from harnessrl.tokenizer import PolicyTokenizer

ADMIN_KEY = "test-admin-key"
ROOT = Path(__file__).resolve().parents[2]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
TURNS: list[Any] = [
    {
        "content": f"Step {k}: computing.",
        "tool_calls": [{"name": "calculator", "arguments": {"expression": f"{k}+1"}}],
    }
    for k in range(5)
] + ["Answer: 5"]


@pytest.fixture(scope="module")
def pg_server() -> Iterator[PostgresServer]:
    try:
        with server_for_tests() as server:
            yield server
    except PostgresUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL is required in CI: {exc}")
        pytest.skip(f"PostgreSQL unavailable: {exc}")


@pytest.fixture
def pg_url(pg_server: PostgresServer) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield pg_server.create_database(name)
    pg_server.drop_database(name)


@dataclass
class Node:
    url: str
    client: GatewayClient
    store: Any


@pytest.fixture
def make_pair(tokenizer: PolicyTokenizer, pg_url: str) -> Iterator[Callable[..., tuple[Node, Node]]]:
    """``make_pair(turns, token_delay_s=...)``: two sibling gateways on one PostgreSQL database."""
    stack = contextlib.ExitStack()

    def make(turns: Any = TURNS, *, token_delay_s: float = 0.0) -> tuple[Node, Node]:
        socks = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
        urls = [f"http://127.0.0.1:{s.getsockname()[1]}" for s in socks]
        nodes = []
        for i in range(2):
            store = open_store(pg_url)
            stack.callback(store.close)
            engine = ScriptedEngine(list(turns), tokenizer, token_delay_s=token_delay_s)
            app = create_app(GatewayConfig(admin_key=ADMIN_KEY), store, engine, siblings=[urls[1 - i]])
            url = stack.enter_context(serve_in_thread(app, sock=socks[i]))
            client = GatewayClient(url, ADMIN_KEY)
            stack.callback(client.close)
            nodes.append(Node(url=url, client=client, store=store))
        return nodes[0], nodes[1]

    with stack:
        yield make


def _sdk(rollout: dict[str, Any], base: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{base}/rollouts/{rollout['rollout_id']}/v1",
        api_key=rollout["api_key"],
        max_retries=0,
        timeout=60,
    )


def test_alternating_calls_are_recorded_once_in_order_with_exact_prefixes(make_pair: Any) -> None:
    a, b = make_pair()
    rollout = a.client.create_rollout({"question": "1+...+5"})
    clients = [_sdk(rollout, a.url), _sdk(rollout, b.url)]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Use the calculator."},
        {"role": "user", "content": "What is 1+...+5?"},
    ]
    replies = []
    for k in range(len(TURNS)):
        # Consecutive calls of one rollout on different gateways: each must see the other's last call.
        message = (
            clients[k % 2]
            .chat.completions.create(model="policy", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
            .choices[0]
            .message
        )
        replies.append(message.content)
        messages.append(message.model_dump(exclude_none=True))
        for tool_call in message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": "ok"})
    # The scripted engine answers call k with turn k: a gateway that missed its peer's calls would
    # count wrong and replay an earlier turn.
    assert replies == [f"Step {k}: computing." for k in range(5)] + ["Answer: 5"]
    calls = a.store.list_calls(rollout["rollout_id"])
    assert [c.seq for c in calls] == list(range(len(TURNS)))
    for prev, nxt in zip(calls, calls[1:], strict=False):
        before = prev.prompt_token_ids + prev.response_token_ids
        assert nxt.prompt_token_ids[: len(before)] == before, (
            f"call {nxt.seq} does not extend call {prev.seq}"
        )


def test_pause_through_one_gateway_drains_the_other_and_resume_releases_both(make_pair: Any) -> None:
    a, b = make_pair(["a slow answer " * 8], token_delay_s=0.03)
    rollouts = [a.client.create_rollout({}) for _ in range(3)]
    finished: dict[str, float] = {}

    def call(name: str, rollout: dict[str, Any], base: str) -> None:
        _sdk(rollout, base).chat.completions.create(model="p", messages=[{"role": "user", "content": name}])
        finished[name] = time.monotonic()

    slow = threading.Thread(target=call, args=("in-flight-on-b", rollouts[0], b.url))
    slow.start()
    deadline = time.monotonic() + 20
    while b.client.state(scope="process")["in_flight"] < 1:
        assert time.monotonic() < deadline, "the call never started on gateway B"
        time.sleep(0.01)
    paused = a.client.pause(timeout=60)
    # Drained means B's call is recorded (its answer may still be on the wire for a moment).
    assert len(a.store.list_calls(rollouts[0]["rollout_id"])) == 1
    assert paused["drained"] is True and paused["paused"] is True and paused["in_flight"] == 0
    assert len(paused["gateways"]) == 2 and all(g["paused"] and g["drained"] for g in paused["gateways"])
    slow.join(timeout=10)
    assert "in-flight-on-b" in finished

    held = [
        threading.Thread(target=call, args=("new-on-a", rollouts[1], a.url)),
        threading.Thread(target=call, args=("new-on-b", rollouts[2], b.url)),
    ]
    for t in held:
        t.start()
    while a.client.state()["waiting"] < 2:
        assert time.monotonic() < deadline + 20, "the new calls never reached the gates"
        time.sleep(0.02)
    assert b.client.state(scope="process")["waiting"] == 1 and a.client.state(scope="process")["waiting"] == 1
    assert "new-on-a" not in finished and "new-on-b" not in finished
    # The trainer updated the shared engine itself: the resume tells every gateway the new version.
    resumed = a.client.resume(policy_version=7)
    assert resumed["released"] == 2 and resumed["paused"] is False
    for t in held:
        t.join(timeout=30)
    assert {"new-on-a", "new-on-b"} <= set(finished)
    assert [c.policy_version for c in a.store.list_calls(rollouts[0]["rollout_id"])] == [0]
    for rollout in rollouts[1:]:
        assert [c.policy_version for c in a.store.list_calls(rollout["rollout_id"])] == [7]


def test_unreachable_peer_fails_the_pause_and_keeps_this_gateway_paused(make_gateway: Any) -> None:
    with socket.create_server(("127.0.0.1", 0)) as dead:
        dead_url = f"http://127.0.0.1:{dead.getsockname()[1]}"
    gw = make_gateway(peers=[dead_url])
    with pytest.raises(UpstreamError, match="unreachable"):
        gw.client.pause(timeout=5)
    # Failing safe: the reachable gateway holds calls, and the trainer was told not to update.
    assert gw.client.state(scope="process")["paused"] is True
    with pytest.raises(UpstreamError, match=dead_url):
        gw.client.resume()
    assert gw.client.state(scope="process")["paused"] is False  # resumed locally all the same


def test_the_newest_command_wins_whatever_order_they_arrive_in(make_gateway: Any) -> None:
    gw = make_gateway()
    api = httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)

    def send(kind: str, order: str) -> httpx.Response:
        return api.post(f"/api/{kind}", params={"order": order, "scope": "process", "timeout": 5})

    assert send("pause", "5.b").json()["paused"] is True
    late_resume = send("resume", "3.a")  # sent before the pause, delivered after it: must not win
    assert late_resume.status_code == 200 and late_resume.json()["superseded"] is True
    assert gw.client.state()["paused"] is True
    assert send("pause", "4.a").json()["drained"] is True  # an older pause while paused: idempotent
    assert send("resume", "6.a").json()["superseded"] is False
    overtaken = send("pause", "5.c")
    assert overtaken.status_code == 409 and "overtaken" in overtaken.json()["error"]["message"]
    assert gw.client.state()["paused"] is False
    # A command issued after another returned gets a later stamp: this pause wins.
    assert gw.client.pause(timeout=5)["paused"] is True and gw.client.state()["order"].startswith("7.")
    assert send("resume", "99.z").json()["superseded"] is False
    assert send("pause", "98.z").status_code == 409  # the clock moved past 99 with that resume
    assert gw.client.pause(timeout=5)["order"].startswith("100.")
    bad = api.post("/api/pause", params={"order": "x"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "order"
    assert api.get("/api/state", params={"scope": "everywhere"}).status_code == 400
    api.close()


def test_cluster_ordering_and_fan_out_scopes() -> None:
    cluster = Cluster(siblings=("http://s1",), remotes=("http://n2",), origin="me")
    assert cluster.targets("cluster") == [("http://s1", "process"), ("http://n2", "node")]
    assert cluster.targets("node") == [("http://s1", "process")]
    assert cluster.targets("process") == []
    assert cluster.stamp((41, "x")) == (41, "x") and cluster.stamp(None) == (42, "me")
    assert cluster.apply((42, "me"), "pause") and not cluster.apply((41, "x"), "resume")
    assert cluster.last_kind == "pause" and cluster.apply((42, "zz"), "resume")  # ties: by origin
    merged = aggregate(
        {"paused": True, "in_flight": 0, "waiting": 1, "drained": True},
        [{"url": "http://s1", "paused": True, "in_flight": 2, "waiting": 0, "drained": False}],
    )
    assert merged["in_flight"] == 2 and merged["waiting"] == 1 and merged["drained"] is False
    assert [g["url"] for g in merged["gateways"]] == ["self", "http://s1"]
    asyncio.run(cluster.aclose())


# -- the real --workers path: separate processes ----------------------------------------------------


def _start_workers(args: list[str], tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "HARNESSRL_ADMIN_KEY": ADMIN_KEY}
    proc = subprocess.Popen(
        [sys.executable, "-m", "harnessrl.gateway", "--port", "0", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        if "listening on" in line:
            url = line.split("listening on ", 1)[1].split()[0]
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep the pipe drained
            return proc, url
        assert time.monotonic() < deadline, "the gateway did not start"
    raise AssertionError(f"the gateway exited with {proc.wait()} before listening")


def test_workers_refuse_an_embedded_engine(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "harnessrl.gateway", "--workers", "2", "--model", "tiny", "--port", "0"],
        cwd=ROOT,
        env={**os.environ, "HARNESSRL_ADMIN_KEY": ADMIN_KEY},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "remote engine" in done.stderr


def test_two_worker_processes_serve_one_address_and_pause_together(pg_url: str, tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(TURNS))
    proc, url = _start_workers(
        ["--workers", "2", "--model", f"scripted:{script}", "--store", pg_url], tmp_path
    )
    try:
        client = GatewayClient(url, ADMIN_KEY)
        deadline = time.monotonic() + 120
        while True:  # ready once both workers answer (a worker still starting fails the fan-out)
            with contextlib.suppress(UpstreamError):
                state = client.state()
                if len(state.get("gateways", [])) == 2:
                    break
            assert time.monotonic() < deadline and proc.poll() is None, "workers did not come up"
            time.sleep(0.2)
        rollout = client.create_rollout({})
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        for k in range(4):
            # A fresh connection per call, so the kernel may hand each to either worker.
            sdk = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
            message = (
                sdk.chat.completions.create(model="p", messages=messages, tools=TOOLS).choices[0].message
            )  # type: ignore[arg-type]
            sdk.close()
            assert message.content == f"Step {k}: computing."
            messages.append(message.model_dump(exclude_none=True))
            messages += [
                {"role": "tool", "tool_call_id": t.id, "content": "ok"} for t in message.tool_calls or []
            ]
        assert [c.seq for c in client.list_calls(rollout["rollout_id"])] == [0, 1, 2, 3]
        paused = client.pause(timeout=30)
        assert paused["drained"] is True and len(paused["gateways"]) == 2
        assert all(g["paused"] for g in client.state()["gateways"])
        assert client.resume()["paused"] is False
        client.close()
        # The entry point mounts the dashboard in every worker (the gateway package does not import
        # it); on a PostgreSQL store its pages answer 501, an unmounted /ui would be a 404.
        ui = httpx.get(f"{url}/ui/", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)
        assert ui.status_code == 501, ui.text
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
