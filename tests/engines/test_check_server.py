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
        with pytest.raises(UpstreamError, match="GET /server_info did not answer"):
            launch.check_server(
                f"http://127.0.0.1:{server.server_port}", timeout=0.3, server_info_timeout=0.3
            )
    finally:
        server.release.set()  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()
