"""A run's start opens the gate of every gateway on its store (``fleet_gateway.announce_start``).

The gate lives in the store and outlives the run. A run killed inside a pause (SIGKILL, the OOM
killer during its first step's training) leaves it closed, and the gateway of the resumed run comes
up paused. With an engine holding its own weights the start used to announce nothing, and a run
resumed before its first checkpoint publishes nothing either: every call of the run waited at the
gate until its rollout's deadline. Real gateways on 127.0.0.1, reached as the trainer reaches its
own (``LocalGateway``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.gateway import create_app
from harnessrl.gateway.control.gating import GatewayHandle
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer
from harnessrl.trainer.fleet_gateway import announce_start
from harnessrl.trainer.fleet_local import LocalGateway

ADMIN_KEY = "test-admin-key"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class OwnWeights:
    """The scripted engine as an engine holding its own weights (as the embedded one does)."""

    def __init__(self, engine: ScriptedEngine) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    @property
    def shares_weights(self) -> bool:
        return False

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        return self._engine.generate(*args, **kwargs)


@contextlib.contextmanager
def gateway_on(store_path: Path, engine: Any) -> Iterator[tuple[Any, str, GatewayClient]]:
    store = SQLiteStore(store_path)
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), store, engine)
    try:
        with serve_in_thread(app) as url, GatewayClient(url, ADMIN_KEY, timeout=60) as client:
            yield app, url, client
    finally:
        store.close()


def left_paused_by_a_killed_run(store_path: Path, *, policy_version: int | None = None) -> None:
    """The gate as a run killed inside its pause leaves it (after its last resume, if any)."""
    store = SQLiteStore(store_path)
    try:
        if policy_version is not None:
            store.command_gate(paused=False, policy_version=policy_version)
        store.command_gate(paused=True)
    finally:
        store.close()


def tokenizer() -> PolicyTokenizer:
    return PolicyTokenizer.from_dir(tiny_model_dir(weights=False))


def test_the_start_of_a_run_opens_a_gate_a_killed_run_left_closed(tmp_path: Path) -> None:
    store_path = tmp_path / "harnessrl.db"
    left_paused_by_a_killed_run(store_path)
    with gateway_on(store_path, OwnWeights(ScriptedEngine(["Hello!"], tokenizer()))) as (app, url, client):
        assert client.state()["paused"] is True  # the run's gateway came up paused
        asyncio.run(announce_start(LocalGateway(GatewayHandle(app.gateway, url))))
        assert client.state()["paused"] is False
        rollout = client.create_rollout({"prompt": "test"})
        answer = httpx.post(
            f"{rollout['base_url']}/chat/completions",
            json=CHAT,
            headers={"Authorization": f"Bearer {rollout['api_key']}"},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-harnessrl-policy-version"] == "0"


def test_control_with_shared_servers_the_start_also_rewinds_the_live_version_to_zero(tmp_path: Path) -> None:
    store_path = tmp_path / "harnessrl.db"
    left_paused_by_a_killed_run(store_path, policy_version=5)
    with gateway_on(store_path, ScriptedEngine(["Hello!"], tokenizer())) as (app, url, client):
        assert client.state()["paused"] is True and client.state()["live_policy_version"] == 5
        asyncio.run(announce_start(LocalGateway(GatewayHandle(app.gateway, url))))
        state = client.state()
        assert state["paused"] is False and state["live_policy_version"] == 0
        assert state["policy_version"] == 0
