"""The local runner's sandbox, tried for real: network reaches only the gateway, limits hold,
timeouts kill the whole tree, and shutdown leaves no orphans.

Every address used here is on 127.0.0.1 (listeners this test starts)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harnessrl.controller.base import ExitKind, Launch, ResourceLimits
from harnessrl.controller.local import LocalRunner
from harnessrl.controller.sandbox_check import LoopbackListener
from harnessrl.sandbox.proxy import GatewayBridge

# A sleep duration no other process on the machine uses, so pgrep finds only ours.
MARK = f"{300 + os.getpid() % 1000}.{time.time_ns() % 10**6}"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and cgroups need root here")


@pytest.fixture(scope="module")
def gateway_listener() -> LoopbackListener:
    return LoopbackListener(b"gateway-ok")


@pytest.fixture(scope="module")
def other_listener() -> LoopbackListener:
    return LoopbackListener(b"LEAKED")


def run_attempt(tmp_path: Path, gateway: LoopbackListener, argv: list[str], **kwargs) -> tuple:
    async def go():
        async with GatewayBridge("127.0.0.1", gateway.port) as bridge:
            runner = LocalRunner(bridge_path=bridge.path)
            launch = Launch(
                rollout_id="r1",
                attempt=0,
                argv=argv,
                env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
                task={},
                files={},
                workspace=tmp_path,
                cwd=tmp_path,
                log_dir=tmp_path / "logs",
                timeout_s=kwargs.get("timeout_s", 30),
                limits=kwargs.get("limits", ResourceLimits()),
                network=kwargs.get("network", "gateway"),
                gateway_port=gateway.port,
            )
            handle = await runner.launch(launch)
            exit_ = await handle.wait()
            await runner.aclose()
            return exit_

    exit_ = asyncio.run(go())
    stdout = (tmp_path / "logs" / "stdout.log").read_text()
    return exit_, stdout


def test_gateway_is_reachable_on_its_usual_port(tmp_path, gateway_listener):
    exit_, out = run_attempt(
        tmp_path,
        gateway_listener,
        [
            sys.executable,
            "-c",
            f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{gateway_listener.port}/').read().decode())",
        ],
    )
    assert exit_.kind is ExitKind.EXITED and exit_.exit_code == 0
    assert "gateway-ok" in out


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_curl_to_another_host_port_fails(tmp_path, gateway_listener, other_listener):
    before = other_listener.connections
    exit_, out = run_attempt(
        tmp_path, gateway_listener, ["curl", "-sS", "-m", "3", f"http://127.0.0.1:{other_listener.port}/"]
    )
    assert exit_.exit_code != 0
    assert "LEAKED" not in out
    assert other_listener.connections == before


def test_python_socket_to_another_host_port_fails(tmp_path, gateway_listener, other_listener):
    before = other_listener.connections
    code = (
        "import socket\n"
        f"s = socket.create_connection(('127.0.0.1', {other_listener.port}), timeout=3)\n"
        "s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n'); print(s.recv(100))\n"
    )
    exit_, out = run_attempt(tmp_path, gateway_listener, [sys.executable, "-c", code])
    assert exit_.exit_code != 0
    assert "LEAKED" not in out
    assert other_listener.connections == before


def test_sleep_forever_is_killed_at_the_deadline(tmp_path, gateway_listener):
    exit_, _ = run_attempt(
        tmp_path, gateway_listener, ["bash", "-c", f"sleep {MARK} & sleep {MARK}; wait"], timeout_s=1.5
    )
    assert exit_.kind is ExitKind.TIMEOUT  # killed at the deadline, not when it finished
    # Nothing of the attempt survives: no `sleep MARK` left anywhere.
    leftover = subprocess.run(["pgrep", "-f", f"sleep {MARK}"], capture_output=True, text=True).stdout.split()
    assert leftover == []


def test_setsid_daemons_forking_at_the_deadline_all_die(tmp_path, gateway_listener):
    # A daemon in its own session, ignoring SIGTERM/SIGHUP, forking sleepers as fast as the process
    # cap lets it: the freezer (v1) or cgroup.kill (v2) stops the whole tree before killing it.
    mark = f"{MARK}1"
    script = f"setsid bash -c 'trap \"\" TERM HUP; while :; do sleep {mark} & done' & sleep 100"
    exit_, _ = run_attempt(
        tmp_path,
        gateway_listener,
        ["bash", "-c", script],
        limits=ResourceLimits(max_processes=40),
        timeout_s=2,
    )
    assert exit_.kind is ExitKind.TIMEOUT
    # wait() returns once the attempt's cgroup is killed and removed: nothing may be left by then.
    leftover = subprocess.run(["pgrep", "-f", f"sleep {mark}"], capture_output=True, text=True).stdout.split()
    assert leftover == []


def test_memory_hog_is_contained(tmp_path, gateway_listener):
    exit_, _ = run_attempt(
        tmp_path,
        gateway_listener,
        [sys.executable, "-c", "x = bytearray(2 * 1024**3); print('allocated')"],
        limits=ResourceLimits(memory_mb=200),
    )
    assert exit_.kind in (ExitKind.OOM, ExitKind.EXITED)
    assert exit_.exit_code != 0


def test_fork_bomb_is_contained(tmp_path, gateway_listener):
    exit_, _ = run_attempt(
        tmp_path,
        gateway_listener,
        ["bash", "-c", ":(){ :|:& };: ; sleep 1; exit 3"],
        limits=ResourceLimits(max_processes=40),
        timeout_s=20,
    )
    assert exit_.kind in (ExitKind.RESOURCE_LIMIT, ExitKind.TIMEOUT)


def test_missing_executable_is_an_infrastructure_failure(tmp_path, gateway_listener):
    # The sandbox's init says it could not start the command: the launch failed, not the policy.
    exit_, _ = run_attempt(tmp_path, gateway_listener, ["/nonexistent/harness"])
    assert exit_.kind is ExitKind.INFRA and "/nonexistent/harness" in exit_.detail


@pytest.mark.parametrize("code", [125, 126, 127])
def test_a_harness_choosing_a_launcher_exit_status_is_still_its_own_outcome(tmp_path, gateway_listener, code):
    # 125 is what the launcher returns when the sandbox cannot be set up, 127 when the command cannot
    # start: a harness that exits with them itself must not pass for an infrastructure failure
    # (retried, left out of its group's baseline) instead of its own 0.
    exit_, _ = run_attempt(tmp_path, gateway_listener, ["bash", "-c", f"exit {code}"])
    assert exit_.kind is ExitKind.EXITED and exit_.exit_code == code
