"""``harnessrl sandbox check``: does the sandbox hold on this machine? Each property, tried for real.

It launches one attempt through the real local runner (bubblewrap, cgroups, the gateway relay) with
a probe program inside, next to a secret file, a "gateway" and another listener on the host's
loopback that it prepares first. The probe tries each property from inside and reports; the
host side checks what only it can see (the secret's listener counts, survivors after the attempt).
Every property is printed as held / NOT HELD; the exit status is non-zero when any does not hold.

It lives in ``controller/``, not ``sandbox/``, because it launches through the controller's
``LocalRunner``: the sandbox package stays below the controller that uses it.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from harnessrl.sandbox.bwrap import find_bwrap, sandbox_problem

PROBE = r"""
import ctypes, json, os, socket, subprocess, sys, urllib.request
libc = ctypes.CDLL(None, use_errno=True)
t = json.loads(sys.argv[1])
out = {}
status = open("/proc/self/status").read()
field = lambda name: next(l.split()[1] for l in status.splitlines() if l.startswith(name + ":"))
out["uid"] = os.getuid()
out["cap_eff"] = field("CapEff")
out["no_new_privs"] = field("NoNewPrivs")
out["seccomp"] = field("Seccomp")
def denied(call):
    try:
        return call() != 0
    except OSError:
        return True
out["setns_denied"] = denied(lambda: libc.setns(os.open("/proc/self/ns/net", os.O_RDONLY), 0))
out["unshare_denied"] = denied(lambda: libc.unshare(0x10000000))
out["mount_denied"] = denied(lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
out["ptrace_denied"] = denied(lambda: libc.ptrace(16, 1, None, None))
out["host_pid_visible"] = os.path.exists(f"/proc/{t['host_pid']}") and b"harnessrl" in open(f"/proc/{t['host_pid']}/cmdline", "rb").read()
out["pids"] = len([p for p in os.listdir("/proc") if p.isdigit()])
out["secret_visible"] = os.path.exists(t["secret"])
out["cgroupfs_visible"] = os.path.exists("/sys/fs/cgroup")
try:
    open("/usr/.harnessrl-check", "w"); out["usr_writable"] = True
except OSError:
    out["usr_writable"] = False
out["workspace_writable"] = open("ws-ok", "w").write("ok") == 2
try:
    socket.create_connection(("127.0.0.1", t["other_port"]), timeout=3).close(); out["other_port"] = True
except OSError:
    out["other_port"] = False
try:
    out["gateway"] = urllib.request.urlopen(f"http://127.0.0.1:{t['gateway_port']}/", timeout=5).read().decode()
except OSError as exc:
    out["gateway"] = repr(exc)
subprocess.Popen(["setsid", "sleep", t["mark"]], start_new_session=True)
print(json.dumps(out), flush=True)
"""


@dataclass(frozen=True)
class Property:
    name: str
    held: bool
    detail: str


class LoopbackListener:
    """A TCP listener on the host's 127.0.0.1 that answers every connection with an HTTP ``reply``
    and counts connections: a "gateway" the sandbox must reach, or a port it must not (the red-team
    tests use it too)."""

    def __init__(self, reply: bytes) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.reply = reply
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.recv(65536)
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(self.reply), self.reply))
            conn.close()

    def close(self) -> None:
        self.sock.close()


def check_sandbox() -> list[Property]:
    """Every property of docs/sandbox.md, tried on this machine."""
    problem = sandbox_problem()
    bwrap = find_bwrap()
    found = [
        Property(
            "bubblewrap installed and able to create namespaces", problem is None, problem or bwrap or ""
        )
    ]
    if problem is not None:
        return found
    return found + asyncio.run(_probe())


async def _probe() -> list[Property]:
    from harnessrl.controller.base import Launch, ResourceLimits
    from harnessrl.controller.local import LocalRunner
    from harnessrl.sandbox.cgroups import ResourceGroup
    from harnessrl.sandbox.proxy import GatewayBridge

    folder = Path(tempfile.mkdtemp(prefix="harnessrl-check-"))
    gateway, other = LoopbackListener(b"gateway-ok"), LoopbackListener(b"LEAKED")
    mark = f"9{secrets.randbelow(10**6)}.{os.getpid()}"
    secret = folder / "secret.txt"
    secret.write_text(secrets.token_hex(8))
    workspace = folder / "attempt" / "workspace"
    workspace.mkdir(parents=True)
    targets = {
        "host_pid": os.getpid(),
        "secret": str(secret),
        "other_port": other.port,
        "gateway_port": gateway.port,
        "mark": mark,
    }
    try:
        async with GatewayBridge("127.0.0.1", gateway.port) as bridge:
            runner = LocalRunner(bridge_path=bridge.path)
            launch = Launch(
                rollout_id="sandbox-check",
                attempt=0,
                argv=[sys.executable, "-I", "-c", PROBE, json.dumps(targets)],
                env={"HOME": str(folder / "attempt" / "home")},
                task={},
                files={},
                workspace=workspace,
                cwd=workspace,
                log_dir=folder / "attempt",
                timeout_s=60,
                limits=ResourceLimits(memory_mb=512, max_processes=64),
                gateway_port=gateway.port,
            )
            handle = await runner.launch(launch)
            exit_ = await handle.wait()
            await runner.aclose()
        stdout = (folder / "attempt" / "stdout.log").read_text()
        stderr = (folder / "attempt" / "stderr.log").read_text()
        try:
            seen = json.loads(stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            return [Property("the probe ran inside the sandbox", False, f"{exit_}: {stderr[-300:]}")]
        time.sleep(0.2)
        survivors = subprocess.run(
            ["pgrep", "-f", f"sleep {mark}"], capture_output=True, text=True
        ).stdout.split()
        group = ResourceGroup.create(f"check-{os.getpid()}", memory_mb=64, max_processes=8)
        if group is not None:
            group.destroy()
        return [
            Property(
                "unprivileged user inside (uid 1000, no capabilities)",
                seen["uid"] == 1000 and int(seen["cap_eff"], 16) == 0,
                f"uid {seen['uid']}, CapEff {seen['cap_eff']}",
            ),
            Property("no_new_privs", seen["no_new_privs"] == "1", f"NoNewPrivs {seen['no_new_privs']}"),
            Property(
                "seccomp filter denies setns, unshare, mount, ptrace",
                seen["seccomp"] == "2"
                and all(seen[k] for k in ("setns_denied", "unshare_denied", "mount_denied", "ptrace_denied")),
                f"Seccomp {seen['seccomp']}",
            ),
            Property(
                "own PID namespace (no host process visible)",
                not seen["host_pid_visible"] and seen["pids"] < 20,
                f"{seen['pids']} processes visible",
            ),
            Property("host files invisible (a secret beside the attempt)", not seen["secret_visible"], ""),
            Property("system folders read-only", not seen["usr_writable"], ""),
            Property("workspace writable", seen["workspace_writable"], ""),
            Property("cgroupfs invisible (limits cannot be raised)", not seen["cgroupfs_visible"], ""),
            Property(
                "network: other host ports unreachable",
                not seen["other_port"] and other.connections == 0,
                f"{other.connections} connections reached the host listener",
            ),
            Property(
                "network: the gateway reachable through the relay",
                seen["gateway"] == "gateway-ok",
                seen["gateway"],
            ),
            Property(
                "memory and process caps (cgroups)",
                group is not None and {"memory", "pids"} <= group.controllers,
                f"cgroup v{group.version}: {sorted(group.controllers)}" if group else "no writable cgroups",
            ),
            Property(
                "nothing outlives the attempt", not survivors, f"survivors: {survivors}" if survivors else ""
            ),
        ]
    finally:
        gateway.close()
        other.close()
        shutil.rmtree(folder, ignore_errors=True)
