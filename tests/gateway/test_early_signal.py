"""A SIGTERM that reaches ``run_gateway`` before uvicorn installs its own handlers stops the gateway.

``run_gateway`` installs a handler under uvicorn's (uvicorn re-raises the stop signal to it after its
graceful shutdown). That handler only logged, so a signal in the window before uvicorn's
``capture_signals`` was lost and the gateway served on. The signal is sent deterministically in that
window: the child process raises it at the start of ``uvicorn.Server.serve`` (uvicorn's code, not
ours), then serves as ``python -m harnessrl.gateway`` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import signal, sys
import uvicorn
from harnessrl.gateway.server import main

serve = uvicorn.Server.serve

async def serve_after_an_early_sigterm(self, sockets=None):
    signal.raise_signal(signal.SIGTERM)  # run_gateway's handler is installed, uvicorn's not yet
    await serve(self, sockets=sockets)

uvicorn.Server.serve = serve_after_an_early_sigterm
main(sys.argv[1:])
"""


def test_sigterm_before_uvicorn_handlers_stops_the_gateway(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": ["hello"]}))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, "--port", "0", "--model", f"scripted:{script}"]
        + ["--store", str(tmp_path / "gw.db")],
        cwd=ROOT,
        env={**os.environ, "HARNESSRL_ADMIN_KEY": "early-signal-admin"},
        capture_output=True,
        text=True,
        timeout=20,  # the old handler lost the signal: the gateway served on, and this expired
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "listening on" in proc.stdout
    assert "gateway stopped by signal" in proc.stderr
    assert "Application startup complete" in proc.stderr  # it stopped once started, not before
