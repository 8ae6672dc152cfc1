"""A real gateway on 127.0.0.1 serving the retriever (the scripted engine, the tiny model's tokenizer,
a fresh SQLite store), over a small corpus written per test."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.retrieval.config import RetrievalConfig
from harnessrl.retrieval.index import RetrievalIndex
from harnessrl.retrieval.route import RetrievalRoutes
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

ADMIN_KEY = "test-admin-key"

PASSAGES = [
    {"id": "velmora", "title": "Velmora", "text": "Velmora is a city founded in 1432 by Arlen Voss."},
    {"id": "arlen", "title": "Arlen Voss", "text": "Arlen Voss is a cartographer born in 1398 in Tarsk."},
    {
        "id": "tarsk",
        "title": "Tarsk",
        "text": "Tarsk is a city in Dornmark. The river Keth flows through it.",
    },
]


def write_corpus(path: Path, passages: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(p) + "\n" for p in passages))
    return path


@dataclass
class SearchGateway:
    url: str
    store: SQLiteStore
    client: GatewayClient
    corpus: Path

    def rollout(self) -> dict[str, Any]:
        return self.client.create_rollout({"prompt": "find it"})

    def search_url(self, rollout: dict[str, Any]) -> str:
        return f"{self.url}/rollouts/{rollout['rollout_id']}/search"


@pytest.fixture(scope="session")
def tokenizer() -> PolicyTokenizer:
    return PolicyTokenizer.from_dir(tiny_model_dir(weights=False))


@pytest.fixture
def make_search_gateway(tokenizer: PolicyTokenizer, tmp_path: Path) -> Iterator[Callable[..., SearchGateway]]:
    """``make_search_gateway(passages=PASSAGES, wrap_index=None, clock=None, **retrieval_config)``;
    stopped at teardown. ``wrap_index(index)`` returns what the routes search instead (a seam for
    tests that hold a search in flight); ``clock`` is the rate limit's (a seam for tests that move
    time themselves)."""
    stack = contextlib.ExitStack()

    def make(
        passages: list[dict[str, Any]] = PASSAGES,
        wrap_index: Callable[[RetrievalIndex], Any] | None = None,
        clock: Callable[[], float] | None = None,
        **retrieval: Any,
    ) -> SearchGateway:
        folder = tmp_path / f"gw-{len(list(tmp_path.glob('gw-*')))}"
        folder.mkdir()
        corpus = write_corpus(folder / "corpus.jsonl", passages)
        config = RetrievalConfig(corpus=str(corpus), cache_dir=str(folder / "cache"), **retrieval)
        index = RetrievalIndex.for_corpus(corpus, folder / "cache")
        store = SQLiteStore(folder / "store.db")
        engine = ScriptedEngine(["Hello!"] * 4, tokenizer)
        app = create_app(
            GatewayConfig(admin_key=ADMIN_KEY),
            store,
            engine,
            extra_routes=RetrievalRoutes(
                wrap_index(index) if wrap_index else index, config, clock=clock
            ).factories(),
        )
        stack.callback(store.close)  # last-in first-out: closed after the server stopped
        url = stack.enter_context(serve_in_thread(app))
        client = GatewayClient(url, ADMIN_KEY)
        stack.callback(client.close)
        return SearchGateway(url, store, client, corpus)

    with stack:
        yield make
