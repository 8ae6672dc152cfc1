"""``launch.check_server``: a vLLM server slow to answer ``/server_info`` gets an error naming it,
never a bare ``TimeoutError`` traceback."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harnessrl.engines import launch
from harnessrl.errors import UpstreamError


class SlowInfo(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        if self.path.startswith("/server_info"):
            self.server.release.wait(600)  # type: ignore[attr-defined]  # answers once the test ended
        body = json.dumps({"data": [{"id": "m", "max_model_len": 64}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_server_info_timeout_is_an_upstream_error_naming_the_endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowInfo)
    server.release = threading.Event()  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        # 5 s: /v1/models must answer in it on a loaded machine too (0.3 s did not always); the wait
        # for /server_info is the larger of the two, so the test takes 5 s.
        with pytest.raises(UpstreamError, match="GET /server_info did not answer"):
            launch.check_server(f"http://127.0.0.1:{server.server_port}", timeout=5, server_info_timeout=1)
    finally:
        server.release.set()  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()


LISTINGS = {
    "a list": [{"id": "m"}],
    "a model that is text": {"data": ["m"]},
    "data an object": {"data": {"id": "m"}},
    "a context length that is text": {"data": [{"id": "m", "max_model_len": "4096"}]},
    "an id that is a number": {"data": [{"id": 5, "max_model_len": 4096}]},
}


class Listing(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        if self.path.startswith("/server_info"):
            answer: object = {"vllm_config": {"model_config": {"logprobs_mode": "processed_logprobs"}}}
        else:
            answer = self.server.listing  # type: ignore[attr-defined]
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("shape", [*LISTINGS, "a vLLM listing"])
def test_a_model_listing_of_another_shape_is_a_config_error_not_a_traceback(shape: str) -> None:
    # A URL that is not a vLLM server's answers /v1/models in another shape: check_server and the
    # engine's start say so (ConfigError), rather than an AttributeError/KeyError traceback, or a
    # context length that is text failing every later call.
    import asyncio

    from harnessrl.engines.tiny import tiny_model_dir
    from harnessrl.engines.vllm import VLLMEngine
    from harnessrl.errors import ConfigError
    from harnessrl.tokenizer import PolicyTokenizer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Listing)
    server.listing = LISTINGS.get(shape, {"data": [{"id": "m", "max_model_len": 64}]})  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    engine = VLLMEngine(url, PolicyTokenizer.from_dir(tiny_model_dir(weights=False)))

    async def start() -> None:
        try:
            await engine.start()
        finally:
            await engine.aclose()

    try:
        if shape == "a vLLM listing":  # control
            assert launch.check_server(url)["max_model_len"] == 64
            asyncio.run(start())
            assert (engine.model_name, engine.context_length) == ("m", 64)
            return
        with pytest.raises(ConfigError, match="is it vLLM"):
            launch.check_server(url)
        if shape != "a list":  # the engine's start finds no listing there: "lists no model", retryable
            with pytest.raises(ConfigError, match="is it vLLM"):
                asyncio.run(start())
    finally:
        server.shutdown()
        server.server_close()
