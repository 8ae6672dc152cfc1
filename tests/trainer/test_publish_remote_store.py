"""``trainer.gateway_url``: the trainer publishes through gateways that must share its store.

A gateway started on another store than the run's ``store.url`` pauses, resumes and versions another
gate (the run's weight updates hold none of the gateways in front of the servers), and answers the
run's rollouts' keys 401. ``remote_fleet`` refuses it at start with a ``ConfigError`` naming the
fields, before the run touches the gateway's gate or creates anything. Real gateways on 127.0.0.1,
a fake vLLM server for the trainer's own engine client.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.fakes.vllm_server import serve_vllm

from harnessrl.client import GatewayClient
from harnessrl.config import EngineConfig, GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.errors import ConfigError
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer
from harnessrl.trainer.fleet import RolloutBook
from harnessrl.trainer.fleet_remote import remote_fleet

ADMIN_KEY = "hrl-admin-publish"


def open_fleet(gateway_url: str, upstream_url: str, store_path: Path, run_dir: Path) -> None:
    """Enter and leave the run's remote fleet, as ``Trainer.run`` does, with the run's store."""
    store = SQLiteStore(store_path)
    book = RolloutBook(store, "run")

    async def enter() -> None:
        async with remote_fleet(
            gateway_url,
            ADMIN_KEY,
            EngineConfig(model=f"vllm:{upstream_url}", tokenizer="tiny"),
            run_dir,
            book,
            pause_timeout_s=30.0,
            message=lambda _: None,
            store_url=str(store_path),
        ):
            pass

    try:
        asyncio.run(enter())
    finally:
        store.close()


@pytest.fixture
def gateway_and_servers(tmp_path: Path):
    """A gateway on ``tmp_path/gateway.db`` and a fake vLLM server: (gateway URL, server URL)."""
    tok = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    store = SQLiteStore(tmp_path / "gateway.db")
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), store, ScriptedEngine(["Hello!"], tok))
    try:
        with serve_vllm(tok.encode("aeiou") + [tok.eos_token_id]) as upstream, serve_in_thread(app) as url:
            yield url, upstream.url
    finally:
        store.close()


def test_a_gateway_on_another_store_is_refused_naming_the_fields(tmp_path: Path, gateway_and_servers) -> None:
    gateway_url, upstream_url = gateway_and_servers
    with pytest.raises(ConfigError, match=r"trainer\.gateway_url.*store\.url"):
        open_fleet(gateway_url, upstream_url, tmp_path / "elsewhere.db", tmp_path / "run")
    state = GatewayClient(gateway_url, ADMIN_KEY).state()
    assert state["command"] == 0 and state["live_policy_version"] is None  # its gate untouched


def test_control_a_gateway_on_the_runs_store_is_driven(tmp_path: Path, gateway_and_servers) -> None:
    gateway_url, upstream_url = gateway_and_servers
    open_fleet(gateway_url, upstream_url, tmp_path / "gateway.db", tmp_path / "run")
    state = GatewayClient(gateway_url, ADMIN_KEY).state()
    assert state["command"] == 1 and state["live_policy_version"] == 0  # the run's start announced
    assert state["paused"] is False
