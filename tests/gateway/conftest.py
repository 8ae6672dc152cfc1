"""Fixtures for gateway tests: a real uvicorn gateway on 127.0.0.1 with the scripted engine and the
tiny model's tokenizer, a fresh SQLite store per test, and helpers to create rollouts."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.engines.base import GenerationContext, Samples, SamplingParams
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store.pg_server import PostgresServer, PostgresUnavailable, server_for_tests
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

ADMIN_KEY = "test-admin-key"


class CountingEngine:
    """The scripted engine, counting what it does: ``sampled`` (tokens yielded, all generations),
    ``started`` and ``running`` generations (an ``Engine`` like any other: the gateway's seam)."""

    def __init__(self, engine: ScriptedEngine) -> None:
        self._engine = engine
        self.sampled = 0
        self.started = 0
        self.running = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, context: GenerationContext | None = None
    ) -> AsyncIterator[Samples]:
        self.started += 1
        self.running += 1
        try:
            async for batch in self._engine.generate(prompt_ids, params, context):
                self.sampled += len(batch.token_ids)
                yield batch
        finally:
            self.running -= 1


@dataclass
class Gateway:
    url: str
    store: SQLiteStore
    engine: Any  # ScriptedEngine, or CountingEngine around one
    client: GatewayClient
    app: Any

    def rollout(self, **kwargs: Any) -> dict[str, Any]:
        """A fresh rollout: ``rollout_id``, ``api_key``, ``base_url``..."""
        return self.client.create_rollout(kwargs.pop("task", {"prompt": "test"}), **kwargs)


@pytest.fixture(scope="session")
def tokenizer() -> PolicyTokenizer:
    return PolicyTokenizer.from_dir(tiny_model_dir(weights=False))


@pytest.fixture
def make_gateway(tokenizer: PolicyTokenizer, tmp_path: Path) -> Iterator[Callable[..., Gateway]]:
    """``make_gateway(turns, token_delay_s=0, counting=False, **gateway_config)`` starts a gateway;
    stopped at teardown. ``counting``: the engine is a ``CountingEngine``; ``policy_tokenizer``: the
    policy's tokenizer (default the tiny model's)."""
    stack = contextlib.ExitStack()
    count = {"n": 0}

    def make(
        turns: Any = ("Hello!",),
        *,
        token_delay_s: float = 0.0,
        context_length: int | None = None,
        keepalive_s: float = 10.0,
        counting: bool = False,
        policy_tokenizer: PolicyTokenizer | None = None,
        **config: Any,
    ) -> Gateway:
        count["n"] += 1
        store = SQLiteStore(tmp_path / f"store-{count['n']}.db")
        engine: Any = ScriptedEngine(
            turns if isinstance(turns, dict) else list(turns),
            policy_tokenizer or tokenizer,
            token_delay_s=token_delay_s,
            context_length=context_length,
        )
        if counting:
            engine = CountingEngine(engine)
        cfg = GatewayConfig(admin_key=ADMIN_KEY, **config)
        app = create_app(cfg, store, engine, keepalive_s=keepalive_s)
        # Closed after the server stops (the stack unwinds in reverse): the gateway leaves the
        # store's gate on its way out.
        stack.callback(store.close)
        url = stack.enter_context(serve_in_thread(app))
        client = GatewayClient(url, ADMIN_KEY)
        stack.callback(client.close)
        return Gateway(url=url, store=store, engine=engine, client=client, app=app)

    with stack:
        yield make


@pytest.fixture
def gateway(make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway()


@pytest.fixture(scope="module")
def pg_server() -> Iterator[PostgresServer]:
    """A real PostgreSQL on loopback for one test module (required in CI, else skipped without one)."""
    try:
        with server_for_tests() as server:
            yield server
    except PostgresUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL is required in CI: {exc}")
        pytest.skip(f"PostgreSQL unavailable: {exc}")
