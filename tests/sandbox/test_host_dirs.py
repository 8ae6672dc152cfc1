"""``SandboxHost`` folders (``harnessrl-sandbox-*`` in the temporary folder: the seccomp program and the
made-up ``/etc``) and the gateway bridge's socket folders (``hrl-*``) outlive no process: a controller killed with ``SIGKILL`` never runs its ``atexit``
clean-up, so the next host sweeps what such processes left, and nothing a living process uses."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harnessrl.sandbox.host import SandboxHost
from harnessrl.sandbox.proxy import GatewayBridge

# A controller's side: make the process-wide host's folder, say where, then wait to be killed (or for
# stdin to end: then its atexit clean-up removes the folder).
OWNER = (
    "import sys\n"
    "from harnessrl.sandbox.host import shared_host\n"
    "etc, _ = shared_host()._prepare()\n"
    "print(etc.parent, flush=True)\n"
    "sys.stdin.read()\n"
)


@pytest.fixture
def own_tmp(tmp_path, monkeypatch) -> Path:
    """The temporary folder of this test and of the processes it starts (never the machine's /tmp)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def start_owner(tmp: Path) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    line = proc.stdout.readline().strip()  # the folder exists once this is written
    assert line, "the owner process failed before making its folder"
    folder = Path(line)
    assert folder.parent == tmp and folder.is_dir()
    return proc, folder


def test_the_folder_of_a_killed_process_is_swept_by_the_next_host(own_tmp):
    owner, folder = start_owner(own_tmp)
    owner.send_signal(signal.SIGKILL)  # no atexit: its folder stays behind
    owner.wait(timeout=60)
    assert folder.is_dir()
    host = SandboxHost()
    try:
        etc, _ = host._prepare()
        assert not folder.exists()
        assert etc.parent.parent == own_tmp and etc.is_dir()
        assert [p.name for p in own_tmp.iterdir()] == [etc.parent.name]
    finally:
        host.close()


def test_control_the_folder_of_a_living_process_is_kept(own_tmp):
    owner, folder = start_owner(own_tmp)
    host = SandboxHost()
    try:
        etc, _ = host._prepare()
        assert folder.is_dir() and (folder / "etc" / "passwd").is_file()
        assert etc.parent != folder
    finally:
        host.close()
        owner.stdin.close()  # it exits normally and removes its own folder
        assert owner.wait(timeout=60) == 0
    assert not folder.exists()


def test_only_abandoned_folders_of_this_user_are_swept(own_tmp):
    """A folder without a lock file is one being created (kept) unless it is old (an older harnessrl's,
    removed); a link named like a host folder is never followed or removed."""
    young, old = own_tmp / "harnessrl-sandbox-young", own_tmp / "harnessrl-sandbox-old"
    young.mkdir()
    old.mkdir()
    (old / "seccomp.bpf").write_bytes(b"x")
    os.utime(old, (0, 0))
    elsewhere = own_tmp / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "owner.lock").write_text("")
    (own_tmp / "harnessrl-sandbox-link").symlink_to(elsewhere)
    host = SandboxHost()
    try:
        host._prepare()
        assert young.is_dir() and not old.exists()
        assert (own_tmp / "harnessrl-sandbox-link").is_symlink() and (elsewhere / "owner.lock").exists()
    finally:
        host.close()


# The gateway bridge's socket folder (``hrl-*``), kept the same way.
BRIDGE = (
    "import asyncio, sys\n"
    "from harnessrl.sandbox.proxy import GatewayBridge\n"
    "async def main():\n"
    "    async with GatewayBridge('127.0.0.1', 9) as bridge:\n"
    "        print(bridge.path, flush=True)\n"
    "        await asyncio.to_thread(sys.stdin.read)\n"
    "asyncio.run(main())\n"
)


def start_bridge(tmp: Path) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", BRIDGE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    line = proc.stdout.readline().strip()
    assert line, "the bridge process failed before making its socket"
    folder = Path(line).parent
    assert folder.parent == tmp and Path(line).is_socket()
    return proc, folder


def test_the_socket_folder_of_a_killed_bridge_is_swept_by_the_next_bridge(own_tmp):
    owner, folder = start_bridge(own_tmp)
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=60)
    assert folder.is_dir()
    bridge = GatewayBridge("127.0.0.1", 9)
    try:
        assert not folder.exists()
    finally:
        asyncio.run(bridge.__aexit__(None, None, None))
    assert list(own_tmp.iterdir()) == []


def test_control_the_socket_folder_of_a_living_bridge_and_unowned_folders_are_kept(own_tmp):
    owner, folder = start_bridge(own_tmp)
    stranger = own_tmp / "hrl-not-ours"  # no owner lock: never a bridge's to judge, however old
    stranger.mkdir()
    os.utime(stranger, (0, 0))
    bridge = GatewayBridge("127.0.0.1", 9)
    try:
        assert folder.is_dir() and stranger.is_dir()
    finally:
        asyncio.run(bridge.__aexit__(None, None, None))
        owner.stdin.close()
        assert owner.wait(timeout=60) == 0
    assert not folder.exists() and stranger.is_dir()
