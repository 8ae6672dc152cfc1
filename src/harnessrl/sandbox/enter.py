"""The first process inside a sandbox: ``python -m harnessrl.sandbox.enter SPEC.json``.

It (1) joins the rollout's cgroups, (2) moves itself into a fresh network namespace whose only
interface is loopback, (3) listens on ``127.0.0.1:<port>`` there and relays every connection to the
gateway through a Unix socket on the host's filesystem (filesystems are shared; networks are not),
(4) starts the harness with rlimits in its own process group, and (5) exits with the harness's
status. So the harness reaches the gateway at the usual ``http://127.0.0.1:<port>`` and nothing else:
no other host port, no outside address, no DNS.

The spec is JSON written by the local runner. ``enter -- CMD...`` instead runs one command with no
network at all (see ``offline``). Exit status: the harness's own, or
128 + signal number if it was killed; 125 if the sandbox itself could not be set up (an
infrastructure failure).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import resource
import socket
import struct
import subprocess
import sys
import threading
from typing import Any

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
SETUP_FAILED = 125


def unshare_network() -> None:
    """Enter a new, empty network namespace (as root; else try a user namespace too)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) == 0:
        return
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        return
    err = ctypes.get_errno()
    raise OSError(err, f"unshare(CLONE_NEWNET) failed: {os.strerror(err)}")


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, SIOCGIFFLAGS, request)[:18])[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _relay(client: socket.socket, unix_path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(unix_path)
    except OSError:
        client.close()
        upstream.close()
        return
    threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
    _pipe(client, upstream)
    client.close()
    upstream.close()


def serve_relay(listener: socket.socket, unix_path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_relay, args=(client, unix_path), daemon=True).start()


def _child_limits(limits: dict[str, Any]) -> None:
    """Runs in the child between fork and exec: rlimits are per process, so set them here."""
    if limits.get("cpu_seconds"):
        resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 5))
    if limits.get("memory_mb") and not limits.get("cgroup_memory"):
        cap = limits["memory_mb"] * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    if limits.get("max_processes") and not limits.get("cgroup_pids"):
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"], limits["max_processes"]))


def offline(argv: list[str]) -> int:
    """``python -m harnessrl.sandbox.enter -- CMD...``: run CMD with no network at all (a fresh
    namespace with only loopback), in this environment and folder. Evaluators use it: they run code
    the policy wrote (tests, conftest.py), which must not reach anything either."""
    try:
        unshare_network()
        loopback_up()
    except OSError as exc:
        print(f"harnessrl sandbox: setup failed: {exc}", file=sys.stderr, flush=True)
        return SETUP_FAILED
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"harnessrl sandbox: cannot start {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        return 127


def main(argv: list[str]) -> int:
    if len(argv) > 2 and argv[1] == "--":
        return offline(argv[2:])
    with open(argv[1]) as f:
        spec = json.load(f)
    try:
        for group in spec.get("cgroup_dirs", []):
            with open(os.path.join(group, "cgroup.procs"), "w") as procs:
                procs.write(str(os.getpid()))
        listener = None
        if spec["network"] == "gateway":
            unshare_network()
            loopback_up()
            if spec.get("gateway_unix_socket"):
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind(("127.0.0.1", int(spec["gateway_port"])))
                listener.listen(128)
    except OSError as exc:
        print(f"harnessrl sandbox: setup failed: {exc}", file=sys.stderr, flush=True)
        return SETUP_FAILED
    limits = spec.get("limits", {})
    try:
        child = subprocess.Popen(
            spec["argv"],
            cwd=spec["cwd"],
            env=spec["env"],
            stdin=subprocess.DEVNULL,
            preexec_fn=lambda: _child_limits(limits),  # no threads exist yet in this process
        )
    except OSError as exc:
        print(f"harnessrl sandbox: cannot start {spec['argv'][0]!r}: {exc}", file=sys.stderr, flush=True)
        return 127
    if listener is not None:
        threading.Thread(
            target=serve_relay, args=(listener, spec["gateway_unix_socket"]), daemon=True
        ).start()
    code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
