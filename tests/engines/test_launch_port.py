"""``EngineServer.start`` refuses a port another server already listens on, before starting anything:
that server would answer ``wait_ready`` for the one being started (which then fails to bind), and
whoever started it would run against the wrong server."""

from __future__ import annotations

import asyncio
import socket
import stat
import sys
from pathlib import Path

import pytest
from tests.fakes.vllm_server import serve_vllm

from harnessrl.config import parse_engine_model
from harnessrl.engines.launch import EngineServer, VLLMLaunch
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.engines.vllm import VLLMEngine
from harnessrl.errors import ConfigError
from harnessrl.tokenizer import PolicyTokenizer


def fake_vllm_python(tmp_path: Path) -> Path:
    """A stand-in for vLLM's interpreter: it serves nothing and waits to be stopped."""
    script = tmp_path / "python"
    script.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(600)\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_a_port_another_server_listens_on_is_refused_before_anything_starts(tmp_path: Path) -> None:
    python = fake_vllm_python(tmp_path)
    with serve_vllm([1]) as other:  # answers /health, /v1/models and /server_info as vLLM would
        server = EngineServer(
            VLLMLaunch(model=str(tmp_path), port=other.port), tmp_path / "v.log", python=str(python)
        )
        try:
            with pytest.raises(ConfigError, match=f"127.0.0.1:{other.port}"):
                server.start()
            assert server.process is None and server.temp_dir is None  # nothing half-started
            assert not (tmp_path / "v.log").exists()
        finally:
            server.stop()


def test_a_free_port_starts_the_server_process(tmp_path: Path) -> None:
    # Control: with the port free, the process is started (and stop ends it).
    python = fake_vllm_python(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = EngineServer(VLLMLaunch(model=str(tmp_path), port=port), tmp_path / "v.log", python=str(python))
    server.start()
    try:
        assert server.process is not None and server.process.poll() is None
    finally:
        process = server.process
        server.stop(timeout_s=10)
    assert process is not None and process.poll() is not None


#: A stand-in for vLLM's interpreter that serves what ``wait_ready`` checks, on the ``--host`` and
#: ``--port`` of the command line it is given (an IPv6 address on an IPv6 socket).
_ANSWERING_VLLM = """
import json, socket, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
argv = sys.argv
host, port = argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])
ANSWERS = {
    "/health": b"",
    "/v1/models": json.dumps({"data": [{"id": "m", "max_model_len": 64}]}).encode(),
    "/server_info": json.dumps({"vllm_config": {"model_config": {"logprobs_mode": "processed_logprobs"}}}).encode(),
}
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = ANSWERS.get(self.path.split("?")[0])
        self.send_response(404 if body is None else 200)
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")
    def log_message(self, *args):
        pass
class Server(HTTPServer):
    address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
Server((host, port), Handler).serve_forever()
"""


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_the_spec_printed_for_an_ipv6_host_reaches_the_server(tmp_path: Path, host: str) -> None:
    """``VLLMLaunch.url`` writes an IPv6 address in brackets: ``harnessrl engine serve --host ::1``
    printed ``engine.model = "vllm:http://::1:8001"``, which the engine could not connect to (a
    ``ValueError`` traceback: "port can't be converted to integer"). 127.0.0.1 is the control."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    except OSError:
        pytest.skip(f"no {host} on this machine")
    python = tmp_path / "python"
    python.write_text(f"#!{sys.executable}\n{_ANSWERING_VLLM}")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    server = EngineServer(
        VLLMLaunch(model=str(tmp_path), host=host, port=port), tmp_path / "v.log", python=str(python)
    )
    server.start()
    try:
        info = server.wait_ready(timeout_s=120)  # generous: only ends a hung test
        # What `engine serve` prints is what the engine is configured with: it reaches the server.
        (url,) = parse_engine_model(server.engine_model).urls
        engine = VLLMEngine(url, PolicyTokenizer.from_dir(tiny_model_dir(weights=False)))

        async def discover() -> None:
            try:
                await engine.start()
            finally:
                await engine.aclose()

        asyncio.run(discover())
    finally:
        server.stop(timeout_s=10)
    assert info == {"model": "m", "max_model_len": 64, "logprobs_mode": "processed_logprobs"}
    assert (engine.model_name, engine.context_length) == ("m", 64)
