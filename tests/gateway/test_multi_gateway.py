"""Several gateways sharing one PostgreSQL store (``gateway.control.cluster``, ``gateway.workers``).

Two real gateways (uvicorn on 127.0.0.1, each with its own ``PostgresStore`` connection pool on the
same database and its own scripted engine), told nothing about each other: the store is what they
share; an OpenAI-SDK agent loop whose consecutive calls alternate between them; pause through one
while a call is in flight on the other. The last tests start ``python -m harnessrl.gateway
--workers 2`` as a real process. Separate gateway processes joining, dying and racing:
``test_gate_processes``.

PostgreSQL: the throwaway server of ``harnessrl.store.pg_server`` (skipped without it, failed in CI).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
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
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store import open_store
from harnessrl.store.pg_server import PostgresServer
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
    """``make_pair(turns, token_delay_s=...)``: two gateways on one PostgreSQL database."""
    stack = contextlib.ExitStack()

    def make(turns: Any = TURNS, *, token_delay_s: float = 0.0) -> tuple[Node, Node]:
        nodes = []
        for _ in range(2):
            store = open_store(pg_url)
            stack.callback(store.close)
            engine = ScriptedEngine(list(turns), tokenizer, token_delay_s=token_delay_s)
            app = create_app(GatewayConfig(admin_key=ADMIN_KEY), store, engine)
            url = stack.enter_context(serve_in_thread(app))
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
    # ~6 s a call: B's must still be in flight when the test looks, on a loaded machine too.
    a, b = make_pair(["a slow answer " * 8], token_delay_s=0.1)
    rollouts = [a.client.create_rollout({}) for _ in range(3)]
    finished: dict[str, float] = {}

    def call(name: str, rollout: dict[str, Any], base: str) -> None:
        _sdk(rollout, base).chat.completions.create(model="p", messages=[{"role": "user", "content": name}])
        finished[name] = time.monotonic()

    slow = threading.Thread(target=call, args=("in-flight-on-b", rollouts[0], b.url))
    slow.start()
    deadline = time.monotonic() + 60  # a wait, not a timing
    while _own(b)["in_flight"] < 1:
        assert time.monotonic() < deadline, "the call never started on gateway B"
        time.sleep(0.01)
    paused = a.client.pause(timeout=60)
    # Drained means B's call is recorded (its answer may still be on the wire for a moment).
    assert len(a.store.list_calls(rollouts[0]["rollout_id"])) == 1
    assert paused["drained"] is True and paused["paused"] is True and paused["in_flight"] == 0
    assert len(paused["gateways"]) == 2 and all(g["paused"] and g["drained"] for g in paused["gateways"])
    assert paused["command"] == a.store.read_gate().command
    slow.join(timeout=60)
    assert "in-flight-on-b" in finished

    held = [
        threading.Thread(target=call, args=("new-on-a", rollouts[1], a.url)),
        threading.Thread(target=call, args=("new-on-b", rollouts[2], b.url)),
    ]
    for t in held:
        t.start()
    while _own(a)["waiting"] < 1 or _own(b)["waiting"] < 1:
        assert time.monotonic() < deadline + 20, "the new calls never reached the gates"
        time.sleep(0.02)
    assert "new-on-a" not in finished and "new-on-b" not in finished
    # The trainer updated the shared engine itself: the resume tells every gateway the new version.
    resumed = a.client.resume(policy_version=7)
    assert resumed["released"] == 1 and resumed["paused"] is False  # A's own; B releases its own
    for t in held:
        t.join(timeout=30)
    assert {"new-on-a", "new-on-b"} <= set(finished)
    assert [c.policy_version for c in a.store.list_calls(rollouts[0]["rollout_id"])] == [0]
    for rollout in rollouts[1:]:
        assert [c.policy_version for c in a.store.list_calls(rollout["rollout_id"])] == [7]


def _own(node: Node) -> dict[str, Any]:
    """The row of the gateway process that answered, as it is now."""
    (own,) = [g for g in node.client.state()["gateways"] if g["self"]]
    return own


def test_peers_are_refused_with_a_message_naming_what_replaced_them() -> None:
    with pytest.raises(ValueError, match=r"gateway\.peers was removed.*docs/scale\.md"):
        GatewayConfig(peers=["http://10.0.0.2:8000"])
    assert GatewayConfig().peers == []


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
        while True:  # ready once both workers registered in the store
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
        assert all(g["paused"] and g["drained"] for g in client.state()["gateways"])
        assert client.resume()["paused"] is False
        client.close()
        # The entry point mounts the dashboard in every worker (the gateway package does not import
        # it); on a PostgreSQL store its pages answer 501, an unmounted /ui would be a 404.
        ui = httpx.get(f"{url}/ui/", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)
        assert ui.status_code == 501, ui.text
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0


def test_a_worker_stopped_on_its_own_fails_the_parent(tmp_path: Path) -> None:
    """SIGTERM to one worker alone (an OOM killer's polite cousin, an operator's mistake): uvicorn
    stops it gracefully and it exits 0, which the parent took for a stop it had asked for, and the
    address served on with one process. Any exit the parent did not cause now stops the others and
    fails the gateway (exit 2, naming the worker)."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(TURNS))
    proc, url = _start_workers(
        ["--workers", "2", "--model", f"scripted:{script}", "--store", str(tmp_path / "gw.db")], tmp_path
    )
    children: list[str] = []
    try:
        client = GatewayClient(url, ADMIN_KEY)
        deadline = time.monotonic() + 120
        while True:  # both workers serving (registered in the store)
            with contextlib.suppress(UpstreamError):
                if len(client.state().get("gateways", [])) == 2:
                    break
            assert time.monotonic() < deadline and proc.poll() is None, "workers did not come up"
            time.sleep(0.2)
        client.close()
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert len(children) == 2, children
        os.kill(int(children[0]), signal.SIGTERM)
        assert proc.wait(timeout=60) == 2
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in children:  # a worker the parent left behind (the bug: it never stopped them)
            with contextlib.suppress(OSError):  # gone already (and its pid not reused by another)
                if b"harnessrl.gateway" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(int(pid), signal.SIGKILL)
