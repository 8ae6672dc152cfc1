"""A harness exhausting what the controller shares with it, tried for real in the bubblewrap
sandbox: the controller's file descriptors through the gateway bridge, its disk through the logs,
one huge file or many files, and the relay's threads inside the sandbox. Each attack is paired
with a control showing ordinary use still works; half-closed requests get their reply.

The "gateway" is a small HTTP server on the host's 127.0.0.1, in the test's own event loop like the
real gateway in the controller's (so its descriptors count against the same process)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import sys
from pathlib import Path

import pytest

from harnessrl.controller.base import Exit, ExitKind, Launch, ResourceLimits
from harnessrl.controller.local import MAX_LOG_BYTES, LocalRunner
from harnessrl.sandbox.bwrap import GATEWAY_SOCKET, sandbox_problem
from harnessrl.sandbox.proxy import MAX_CONNECTIONS_PER_SANDBOX, GatewayBridge

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and cgroups need root here"),
    pytest.mark.skipif(sandbox_problem() is not None, reason=f"no sandbox here: {sandbox_problem()}"),
]

OK_REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


class Gateway:
    """Answers each request (read up to its blank line) with ``OK_REPLY``, any number at once."""

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(OK_REPLY)
            await writer.drain()
        writer.close()

    async def __aenter__(self) -> Gateway:
        self.server = await asyncio.start_server(self._answer, "127.0.0.1", 0, backlog=4096)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def health(self) -> bytes:
        """``GET /api/health`` from the host, as a monitor would; the reply, or the error."""
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.port), 10)
            writer.write(b"GET /api/health HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            return reply
        except (OSError, TimeoutError) as exc:
            return repr(exc).encode()


def launch_of(workspace: Path, gateway: Gateway, code: str, **kwargs) -> Launch:
    workspace.mkdir(parents=True, exist_ok=True)
    return Launch(
        rollout_id=workspace.name,
        attempt=0,
        argv=kwargs.pop("argv", None) or [sys.executable, "-c", code],
        env={"PATH": os.environ["PATH"], "HOME": str(workspace)},
        task={},
        files={},
        workspace=workspace,
        cwd=workspace,
        log_dir=workspace.parent / f"{workspace.name}-logs",
        timeout_s=kwargs.pop("timeout_s", 60),
        gateway_port=gateway.port,
        **kwargs,
    )


def attempt(tmp_path: Path, code: str, **kwargs) -> tuple[Exit, str]:
    """Run ``code`` (Python) in the sandbox; its exit and stdout."""

    async def go() -> Exit:
        async with Gateway() as gateway, GatewayBridge("127.0.0.1", gateway.port) as bridge:
            runner = LocalRunner(bridge_path=bridge.path)
            handle = await runner.launch(launch_of(tmp_path / "ws", gateway, code, **kwargs))
            exit_ = await handle.wait()
            await runner.aclose()
            return exit_

    exit_ = asyncio.run(go())
    return exit_, (tmp_path / "ws-logs" / "stdout.log").read_text(errors="replace")


# One GET to the gateway through the relay, as a harness's HTTP client makes it.
GET = """
def get(port):
    import urllib.request
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10).status
    except Exception as exc:
        return repr(exc)
"""


# -- 1. descriptors: one sandbox cannot take the controller's through the bridge -------------------

FLOOD = f"""
import socket, sys, time
from pathlib import Path
n = int(sys.argv[1]) if len(sys.argv) > 1 else 0
held = []
for _ in range(n):
    s = socket.socket(socket.AF_UNIX)
    s.connect({GATEWAY_SOCKET!r})
    held.append(s)
Path("held").write_text(str(len(held)))
print("held", len(held), flush=True)
time.sleep(120)
"""


@pytest.fixture
def fewer_descriptors():
    """The controller's own descriptor limit, lowered for the test: a flood that takes thousands
    of them shows as EMFILE here, not only on a machine at 20000."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield lambda n: resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + n, hard))
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("connections", [5, 2000], ids=["control-5", "flood-2000"])
def test_a_connection_flood_leaves_the_gateway_answering_everyone(tmp_path, fewer_descriptors, connections):
    async def go() -> tuple[int, int, bytes, str]:
        async with Gateway() as gateway, GatewayBridge("127.0.0.1", gateway.port) as bridge:
            runner = LocalRunner(bridge_path=bridge.path)
            before = len(os.listdir("/proc/self/fd"))
            flood = launch_of(tmp_path / "flood", gateway, FLOOD, limits=ResourceLimits(max_processes=None))
            flood.argv.append(str(connections))
            attacker = await runner.launch(flood)
            for _ in range(600):  # until the attacker holds its connections (it says so in a file)
                if (tmp_path / "flood" / "held").exists():
                    break
                await asyncio.sleep(0.1)
            fewer_descriptors(1500)  # the flood lands on a controller with 1500 to spare
            await asyncio.sleep(1)  # let the bridge take in what is still queued on its socket
            used = len(os.listdir("/proc/self/fd")) - before
            health = await gateway.health()
            other = await runner.launch(
                launch_of(tmp_path / "other", gateway, GET + f"print('other', get({gateway.port}))")
            )
            other_exit = await other.wait()
            await attacker.kill()
            await attacker.wait()
            await runner.aclose()
            out = (tmp_path / "other-logs" / "stdout.log").read_text()
            return used, other_exit.exit_code, health, out

    used, code, health, out = asyncio.run(go())
    assert (tmp_path / "flood" / "held").read_text() == str(connections)
    # ~3 descriptors per connection held (accepted socket, TCP client, gateway's side), at most the cap.
    assert used <= 3 * min(connections, MAX_CONNECTIONS_PER_SANDBOX) + 20
    assert health.startswith(b"HTTP/1.1 200 OK"), health
    assert code == 0 and "other 200" in out, out


def test_connections_past_the_cap_are_closed_at_once(tmp_path):
    # Inside: open the cap + 10, then ask on each; the first `cap` are answered, the rest closed.
    code = f"""
import socket
held = []
for _ in range({MAX_CONNECTIONS_PER_SANDBOX + 10}):
    s = socket.socket(socket.AF_UNIX); s.connect({GATEWAY_SOCKET!r}); held.append(s)
answered = 0
for s in held:
    try:
        s.sendall(b"GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
        s.settimeout(10)
        answered += s.recv(100).startswith(b"HTTP/1.1 200")
    except OSError:
        pass
print("answered", answered)
"""
    exit_, out = attempt(tmp_path, code)
    assert exit_.exit_code == 0, out
    assert f"answered {MAX_CONNECTIONS_PER_SANDBOX}\n" in out


def test_the_sandbox_holds_at_most_open_files_descriptors(tmp_path):
    exit_, out = attempt(tmp_path, "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))")
    assert exit_.exit_code == 0 and out == "(4096, 4096)\n"


@pytest.mark.parametrize("open_files", [16, 64, 1024], ids=["16", "64", "control-1024"])
def test_an_open_files_cap_below_the_launchers_status_descriptor_runs(tmp_path, open_files):
    # The launcher hands init.py its status on descriptor 200: a cap of 16 or 64 (the config allows 16)
    # made every attempt an infrastructure failure, the launcher dying of EBADF before bwrap started.
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))"
    exit_, out = attempt(tmp_path, code, limits=ResourceLimits(open_files=open_files))
    assert exit_.kind is ExitKind.EXITED and exit_.exit_code == 0, exit_
    assert out == f"({open_files}, {open_files})\n"


# -- 2. disk: logs, one file, the workspace and home together ------------------------------------


def test_stdout_log_keeps_at_most_max_log_bytes_its_beginning_and_end(tmp_path):
    exit_, _ = attempt(
        tmp_path,
        f"import sys\nfor _ in range(12): sys.stdout.buffer.write(b'x' * {1024 * 1024})\nprint('end')",
    )
    assert exit_.kind is ExitKind.EXITED and exit_.exit_code == 0  # the harness was never blocked
    log = (tmp_path / "ws-logs" / "stdout.log").read_bytes()
    assert len(log) <= MAX_LOG_BYTES + 100
    # Its beginning and its end (the evaluator reads the end), a line for what was dropped between.
    assert log.startswith(b"x" * 1000) and log.endswith(b"x" * 1000 + b"end\n")
    assert b"bytes of this log dropped here" in log


def test_a_small_log_is_kept_whole(tmp_path):
    exit_, out = attempt(tmp_path, "import sys; print('hello'); print('oops', file=sys.stderr)")
    assert exit_.exit_code == 0 and out == "hello\n"
    assert (tmp_path / "ws-logs" / "stderr.log").read_text() == "oops\n"


FALLOCATE = """
import os, sys
try:
    fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY)
    os.posix_fallocate(fd, 0, int(sys.argv[2]) * 1024 * 1024)
    print("allocated")
except OSError as exc:
    print("refused", exc.errno)
"""


@pytest.mark.parametrize("mb", [1, 16], ids=["control-1MB", "past-the-cap-16MB"])
def test_one_file_cannot_pass_file_mb(tmp_path, mb):
    async def go() -> Exit:
        async with Gateway() as gateway, GatewayBridge("127.0.0.1", gateway.port) as bridge:
            runner = LocalRunner(bridge_path=bridge.path)
            launch = launch_of(tmp_path / "ws", gateway, FALLOCATE, limits=ResourceLimits(file_mb=8))
            launch.argv += ["big", str(mb)]
            exit_ = await (await runner.launch(launch)).wait()
            await runner.aclose()
            return exit_

    exit_ = asyncio.run(go())
    out = (tmp_path / "ws-logs" / "stdout.log").read_text()
    if mb == 1:
        assert out == "allocated\n"
    else:
        assert out == "refused 27\n"  # EFBIG
        assert (tmp_path / "ws" / "big").stat().st_blocks * 512 <= 8 * 1024 * 1024
    assert exit_.exit_code == 0


def test_a_program_killed_past_file_mb_is_a_resource_limit(tmp_path):
    # Unlike Python, most programs die of SIGXFSZ past RLIMIT_FSIZE.
    exit_, _ = attempt(
        tmp_path,
        "",
        argv=["bash", "-c", "head -c 16M /dev/zero > big"],
        limits=ResourceLimits(file_mb=8),
    )
    assert exit_.kind is ExitKind.RESOURCE_LIMIT and "file size" in exit_.detail, exit_


@pytest.mark.parametrize("mb", [4, 40], ids=["control-4MB", "past-the-budget-40MB"])
def test_workspace_and_home_cannot_pass_disk_mb(tmp_path, mb):
    # Files of 4 MB in the workspace and home, under file_mb, together past disk_mb; then wait.
    code = f"""
import os, time
for i in range({mb} // 4):
    folder = "." if i % 2 else os.environ["HOME"]
    fd = os.open(f"{{folder}}/part{{i}}", os.O_CREAT | os.O_WRONLY)
    os.posix_fallocate(fd, 0, 4 * 1024 * 1024)
    os.close(fd)
print("written", flush=True)
time.sleep({0 if mb == 4 else 60})
"""
    home = tmp_path / "home"
    home.mkdir()
    exit_, out = attempt(
        tmp_path, code, limits=ResourceLimits(disk_mb=20, file_mb=8), home=home, timeout_s=90
    )
    assert "written" in out
    if mb == 4:
        assert exit_.kind is ExitKind.EXITED and exit_.exit_code == 0
    else:
        assert exit_.kind is ExitKind.RESOURCE_LIMIT and "disk" in exit_.detail, exit_


# Ways past a path walk of the workspace: files held open after their unlinking (no name left to walk
# to), and files in folders nested past PATH_MAX (no path reaches them). Each writes 40 MB in files of
# 4 MB, under file_mb, past disk_mb = 20; then waits to be killed.
HIDDEN_WRITES = {
    "unlinked-held-open": """
held = []
for i in range(10):
    f = open(f"part{i}", "wb")
    os.unlink(f"part{i}")
    os.posix_fallocate(f.fileno(), 0, 4 * 1024 * 1024)
    held.append(f)
""",
    "nested-past-path-max": """
for _ in range(25):  # 25 folders of 200 characters: past the host's PATH_MAX (4096)
    os.mkdir("d" * 200)
    os.chdir("d" * 200)
for i in range(10):
    fd = os.open(f"part{i}", os.O_CREAT | os.O_WRONLY)
    os.posix_fallocate(fd, 0, 4 * 1024 * 1024)
    os.close(fd)
""",
}


@pytest.mark.parametrize("how", sorted(HIDDEN_WRITES))
def test_files_out_of_a_path_walks_reach_count_against_disk_mb(tmp_path, how):
    code = f"import os, time\n{HIDDEN_WRITES[how]}\nprint('written', flush=True)\ntime.sleep(60)\n"
    exit_, out = attempt(tmp_path, code, limits=ResourceLimits(disk_mb=20, file_mb=8), timeout_s=90)
    assert "written" in out
    assert exit_.kind is ExitKind.RESOURCE_LIMIT and "disk" in exit_.detail, exit_


# -- 3. the relay inside: no thread per connection --------------------------------------------------


@pytest.mark.parametrize("connections", [5, 30, 60], ids=["control-5", "30-keep-alive", "60-keep-alive"])
def test_the_relay_survives_more_connections_than_the_process_cap(tmp_path, connections):
    # Connections held open at once (2 relay threads each in a thread-per-connection relay: 30 is past
    # max_processes=20 + the wrapper's 16), each asked once, then closed; then one more request.
    code = (
        GET
        + f"""
import socket, time
port = {{port}}
held = [socket.create_connection(("127.0.0.1", port), timeout=2) for _ in range({connections})]
time.sleep(1)  # the attack: let the relay take every connection in before any ends
for s in held:
    try:
        s.sendall(b"GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
        s.recv(100)
    except OSError:
        pass
for s in held:
    s.close()
print("after", get(port))
"""
    )

    async def go() -> tuple[Exit, str]:
        async with Gateway() as gateway, GatewayBridge("127.0.0.1", gateway.port) as bridge:
            runner = LocalRunner(bridge_path=bridge.path)
            launch = launch_of(
                tmp_path / "ws",
                gateway,
                code.replace("{port}", str(gateway.port)),
                limits=ResourceLimits(max_processes=20),
            )
            exit_ = await (await runner.launch(launch)).wait()
            await runner.aclose()
            return exit_, (tmp_path / "ws-logs" / "stdout.log").read_text()

    exit_, out = asyncio.run(go())
    assert exit_.exit_code == 0, out
    assert "after 200" in out


# -- 4. half-closed requests -----------------------------------------------------------------------

HALF_CLOSE = """
import socket, sys
if sys.argv[1] == "tcp":
    s = socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=10)
else:
    s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[2])
s.sendall(b"GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
s.shutdown(socket.SHUT_WR)  # the whole request is sent; the reply must still come back
reply = b""
while chunk := s.recv(4096):
    reply += chunk
print(reply.split(b"\\r\\n")[0].decode() or "empty reply")
"""


@pytest.mark.parametrize("via", ["tcp", "unix"])
def test_a_half_closed_request_gets_its_reply(tmp_path, via):
    async def go() -> str:
        async with Gateway() as gateway, GatewayBridge("127.0.0.1", gateway.port) as bridge:
            runner = LocalRunner(bridge_path=bridge.path)
            launch = launch_of(tmp_path / "ws", gateway, HALF_CLOSE)
            launch.argv += [via, str(gateway.port) if via == "tcp" else GATEWAY_SOCKET]
            await (await runner.launch(launch)).wait()
            await runner.aclose()
            return (tmp_path / "ws-logs" / "stdout.log").read_text()

    assert asyncio.run(go()) == "HTTP/1.1 200 OK\n"


def test_a_half_closed_request_gets_its_reply_from_the_bridge_itself(tmp_path):
    # The host side alone (no sandbox): the bridge must pass the half-close on, not close.
    async def go() -> bytes:
        async with Gateway() as gateway, GatewayBridge("127.0.0.1", gateway.port) as bridge:
            reader, writer = await asyncio.open_unix_connection(bridge.path)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            writer.write_eof()
            reply = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            return reply

    assert asyncio.run(go()) == OK_REPLY
