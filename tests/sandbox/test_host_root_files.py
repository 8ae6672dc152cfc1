"""What the host's root owns stays out of a sandbox's reach, although the sandbox user *is* that root.

bubblewrap maps the sandbox user (uid 1000) to the uid that started it: root on our machines, so
inside, every file the host's root owns is the sandbox user's own. A sysctl file's only check is its
mode against that uid (``/proc/sys/kernel/core_pattern`` is 0644): without a read-only ``/proc/sys``,
code in the sandbox could write ``|/path/in/workspace`` there and have the kernel run it as root on
the host at the next crash. The probe only opens each file for writing and closes it: nothing is
ever written to the machine's sysctls. Likewise ``/etc/ssl/private`` (0710, root), where a host keeps
its TLS keys, would be readable inside: only the certificates and OpenSSL's configuration are bound.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

import harnessrl.sandbox.bwrap as bwrap_module
import harnessrl.sandbox.host as host_module
from harnessrl.controller.sandbox_check import host_sysctls_read_only, run_probe
from harnessrl.controller.sandbox_probe import HOST_SYSCTLS
from harnessrl.sandbox.bwrap import ETC_ENTRIES, sandbox_problem

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or sandbox_problem() is not None, reason=f"no sandbox here: {sandbox_problem()}"
)


def without_read_only_proc_sys(argv: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(argv):
        if argv[i : i + 3] == ["--ro-bind", "/proc/sys", "/proc/sys"]:
            i += 3
            continue
        out.append(argv[i])
        i += 1
    return out


def test_host_sysctls_cannot_be_opened_for_writing_inside():
    run = run_probe(["sysctls"])
    seen = run.seen.get("sysctls", {})
    assert set(seen) == set(HOST_SYSCTLS), run.stderr[-2000:]
    assert seen["/proc/sys/kernel/core_pattern"] == "EROFS", seen
    assert all(answer in ("EROFS", "ENOENT") for answer in seen.values()), seen  # ENOENT: no such sysctl here
    assert host_sysctls_read_only(seen).held


def test_control_a_sandbox_without_the_read_only_proc_sys_can_open_them(monkeypatch):
    """The same bubblewrap sandbox, less the read-only bind: the probe sees the files writable."""
    real = host_module.bwrap_argv
    monkeypatch.setattr(
        host_module, "bwrap_argv", lambda layout, **kw: without_read_only_proc_sys(real(layout, **kw))
    )
    run = run_probe(["sysctls"])
    seen = run.seen.get("sysctls", {})
    assert seen.get("/proc/sys/kernel/core_pattern") == "writable", (seen, run.stderr[-2000:])
    found = host_sysctls_read_only(seen)
    assert not found.held and "core_pattern" in found.detail


def listing_inside(tmp_path: Path, folder: str) -> list[str]:
    """What a sandboxed process sees in ``folder`` (the real local runner, no network)."""
    from harnessrl.controller.base import Launch, ResourceLimits
    from harnessrl.controller.local import LocalRunner

    workspace = tmp_path / "ws"
    workspace.mkdir()
    code = f"import json, os; print(json.dumps(sorted(os.listdir({folder!r}))))"

    async def go():
        runner = LocalRunner(bridge_path=None)
        launch = Launch(
            rollout_id="r1",
            attempt=0,
            argv=[sys.executable, "-c", code],
            env={"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home")},
            task={},
            files={},
            workspace=workspace,
            cwd=workspace,
            log_dir=tmp_path / "logs",
            timeout_s=60,
            limits=ResourceLimits(),
            network="none",
        )
        try:
            return await (await runner.launch(launch)).wait()
        finally:
            await runner.aclose()

    exit_ = asyncio.run(go())
    out = (tmp_path / "logs" / "stdout.log").read_text()
    assert exit_.exit_code == 0, (exit_, (tmp_path / "logs" / "stderr.log").read_text()[-2000:])
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.isdir("/etc/ssl/private"), reason="no /etc/ssl/private on this host")
def test_the_hosts_private_keys_folder_is_not_inside(tmp_path):
    seen = listing_inside(tmp_path, "/etc/ssl")
    assert "private" not in seen
    assert "certs" in seen  # what TLS clients need is there


@pytest.mark.skipif(not os.path.isdir("/etc/ssl/private"), reason="no /etc/ssl/private on this host")
def test_control_binding_etc_ssl_whole_shows_the_private_keys_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(bwrap_module, "ETC_ENTRIES", (*ETC_ENTRIES, "ssl"))
    assert "private" in listing_inside(tmp_path, "/etc/ssl")
