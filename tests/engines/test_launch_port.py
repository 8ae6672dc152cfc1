"""``EngineServer.start`` refuses a port another server already listens on, before starting anything:
that server would answer ``wait_ready`` for the one being started (which then fails to bind), and
whoever started it would run against the wrong server."""

from __future__ import annotations

import socket
import stat
import sys
from pathlib import Path

import pytest
from tests.fakes.vllm_server import serve_vllm

from harnessrl.engines.launch import EngineServer, VLLMLaunch
from harnessrl.errors import ConfigError


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
