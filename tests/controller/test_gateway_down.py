"""A gateway that is down while a harness runs: the harness's calls are refused, it fails, and the
scorer gives 0 — which used to be recorded as the policy's failure (a 0 trained on answers the
model never gave). Now the attempt is an infrastructure failure (retried like any other). Real
sandboxed harnesses reaching the "gateway" through the real ``GatewayBridge``; the control runs the
same harness against a gateway that is up, and is scored as the policy's."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.controller import Controller, ControllerConfig, GatewayEndpoint
from harnessrl.controller.evaluators import build_evaluator
from harnessrl.controller.local import LocalRunner
from harnessrl.sandbox.proxy import GatewayBridge
from harnessrl.schemas import RolloutStatus
from harnessrl.store.sqlite import SQLiteStore

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")

# Only ends a hung test: every wait below is for a state.
PATIENCE_S = 60

# One call to the gateway, then a failure whatever it answered: only the gateway's state differs.
ONE_CALL = """
import os, sys, urllib.request
try:
    urllib.request.urlopen(os.environ["OPENAI_BASE_URL"] + "/models", timeout=30)
    print("the gateway answered")
except Exception as exc:
    print("the gateway did not answer:", exc)
sys.exit(1)
"""

# A first call refused, a mark left in the workspace, then calls until the gateway is back.
REFUSED_THEN_BACK = """
import os, pathlib, sys, time, urllib.request
url = os.environ["OPENAI_BASE_URL"] + "/models"
try:
    urllib.request.urlopen(url, timeout=30)
    sys.exit(3)
except Exception:
    pathlib.Path("refused").write_text("")
for _ in range(2400):
    try:
        urllib.request.urlopen(url, timeout=30)
        break
    except Exception:
        time.sleep(0.05)
sys.exit(1)
"""


class Listener(ThreadingHTTPServer):
    """An HTTP "gateway" on ``port`` (0: any) of 127.0.0.1 answering every GET with a 200, served by
    a thread of its own until ``close``."""

    def __init__(self, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Answer200)  # reuses the address (allow_reuse_address)
        self.port = self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _Answer200(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        pass  # no access log on the test's stderr


def free_port() -> int:
    """A port nothing listens on (refused) when the test starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_one(tmp_path: Path, port: int, code: str, while_running=None):  # noqa: ANN001
    """One rollout of the harness ``code`` (a 0 from the scorer), its gateway at ``port``;
    ``while_running(workspace)`` runs beside it. Returns the ended rollout."""
    store = SQLiteStore(tmp_path / "db.sqlite")
    rid = store.create_rollout(task={}).rollout_id

    async def go():
        async with GatewayBridge("127.0.0.1", port) as bridge:
            controller = Controller(
                store,
                LocalRunner(bridge_path=bridge.path),
                gateway=GatewayEndpoint("127.0.0.1", port),
                harness=HarnessSpec(command=["python3", "-c", code], timeout_s=PATIENCE_S),
                evaluator=build_evaluator({"type": "command", "command": ["false"]}),
                run_dir=tmp_path / "run",
                config=ControllerConfig(poll_interval_s=0.1, max_infra_retries=0),
                bridge=bridge,
            )
            workspace = tmp_path / "run" / "rollouts" / rid / "attempt-0" / "workspace"
            beside = (
                asyncio.create_task(asyncio.to_thread(while_running, workspace)) if while_running else None
            )
            try:
                [rollout] = await controller.run_until_done([rid], timeout_s=PATIENCE_S * 2)
            finally:
                await controller.shutdown()
            if beside is not None:
                await beside
            return rollout

    try:
        return asyncio.run(go())
    finally:
        store.close()


def test_a_harness_whose_gateway_is_down_is_an_infrastructure_failure(tmp_path):
    rollout = run_one(tmp_path, free_port(), ONE_CALL)
    assert rollout.status is RolloutStatus.FAILED and rollout.outcome.value == "infra_failure", rollout
    assert "gateway refused connections" in (rollout.error or "")


def test_a_gateway_down_for_a_while_voids_the_attempt_even_when_it_is_back_at_the_end(tmp_path):
    port = free_port()
    back: list[Listener] = []

    def bring_back(workspace: Path) -> None:  # once the harness has seen a refusal
        deadline = time.monotonic() + PATIENCE_S
        while not (workspace / "refused").exists():
            assert time.monotonic() < deadline, "the harness never saw the gateway down"
            time.sleep(0.05)
        back.append(Listener(port))

    try:
        rollout = run_one(tmp_path, port, REFUSED_THEN_BACK, bring_back)
    finally:
        for listener in back:
            listener.close()
    assert back, "the gateway was never brought back"
    assert rollout.outcome.value == "infra_failure", rollout
    assert rollout.metadata.get("exit") is None  # ended before the scorer ran


def test_control_the_same_harness_with_its_gateway_up_is_the_policys_failure(tmp_path):
    gateway = Listener()
    try:
        rollout = run_one(tmp_path, gateway.port, ONE_CALL)
    finally:
        gateway.close()
    assert rollout.status is RolloutStatus.FINISHED and rollout.outcome.value != "infra_failure", rollout
    assert rollout.reward == 0.0
    assert rollout.metadata["exit"]["code"] == 1
