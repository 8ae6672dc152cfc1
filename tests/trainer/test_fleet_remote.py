"""``trainer.gateway_url`` at a server that is not a harnessrl gateway: the trainer's check that the
gateway uses the run's store (``fleet_remote.check_same_store``) refuses it by name, and a pause
answered with something other than a gateway's answer is an ``UpstreamError`` (no weights move)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

import pytest
from tests.fakes.http_server import served

from harnessrl.client import GatewayClient
from harnessrl.config import EngineConfig
from harnessrl.engines.factory import create_engine
from harnessrl.errors import ConfigError, UpstreamError
from harnessrl.store import open_store
from harnessrl.trainer.fleet import RolloutBook
from harnessrl.trainer.fleet_gateway import GatewayFleet
from harnessrl.trainer.fleet_remote import RemoteGateway, check_same_store


@contextmanager
def serve_json(body: object) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 answering every GET and POST with ``body`` as JSON; yields
    its URL."""
    payload = json.dumps(body).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_POST = do_GET

        def log_message(self, *args: object) -> None:
            pass

    with served(Handler) as url:
        yield url


@pytest.mark.parametrize(
    "body",
    [
        ["a", "list"],  # another JSON API at that address
        "ok",
        {"gateway_id": "g", "gateways": ["g1", 7]},  # gateways that are not objects
        {"gateway_id": ["unhashable"], "gate": "default"},
    ],
)
def test_a_server_that_is_not_a_harnessrl_gateway_is_a_config_error(tmp_path, body):
    """Regression: ``/api/state`` answering JSON that is not a gateway's state (a list, a string,
    odd ``gateways``) crashed the run's start with an ``AttributeError`` / ``TypeError`` traceback
    instead of naming ``trainer.gateway_url``."""
    store_url = str(tmp_path / "run.db")
    store = open_store(store_url)
    try:
        with serve_json(body) as url, GatewayClient(url, "hrl-admin-key") as client:
            state = client.state()
            with pytest.raises(ConfigError, match=r"trainer\.gateway_url: the gateway at .* does not"):
                check_same_store(state, store, url, store_url)
    finally:
        store.close()


@pytest.mark.parametrize("body", [["drained"], "ok", 1, {"drained": "false"}])
def test_a_pause_answered_with_something_else_than_a_gateways_answer_is_an_upstream_error(tmp_path, body):
    """Regression: a pause answered with JSON that is not an object (another service at
    ``trainer.gateway_url``, a proxy) ended the run with an ``AttributeError`` traceback from the
    drain check instead of the ``UpstreamError`` that names the gateway; ``"drained": "false"`` (a
    string, truthy) passed for drained, and the weights changed under calls still in flight."""
    store = open_store(str(tmp_path / "run.db"))
    engine = create_engine(EngineConfig(model="vllm:http://127.0.0.1:9", tokenizer="tiny"))  # never started

    async def pause(url: str) -> None:
        with GatewayClient(url, "hrl-admin-key") as client:
            gateway = RemoteGateway(client, engine, pause_timeout_s=1.0)
            fleet = GatewayFleet(RolloutBook(store, "run"), gateway, weights_root=tmp_path / "weights")
            async with fleet.paused():
                pytest.fail("paused on an answer that says nothing about the drain")

    try:
        refused = pytest.raises(UpstreamError, match=r"gateway at http://127\.0\.0\.1:\d+: POST /api/pause")
        with serve_json(body) as url, refused:
            asyncio.run(pause(url))
    finally:
        store.close()
