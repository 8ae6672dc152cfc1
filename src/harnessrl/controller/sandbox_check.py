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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harnessrl
from harnessrl.controller.sandbox_check_evaluator import (
    EvaluatorProbe,
    copy_held,
    limits_held,
    prepare_workspace,
    probe_evaluator,
)
from harnessrl.controller.seccomp_probes import DENIED_ERRNOS, seccomp_calls, syscall_number
from harnessrl.sandbox.bwrap import DEFAULT_PATH, find_bwrap, sandbox_problem

HARNESSRL_PACKAGE = Path(harnessrl.__file__).parent  # bound read-only for the scorer section

PROBE = Path(__file__).with_name("sandbox_probe.py")  # run inside, bound there by itself


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


HOST_SYSCTLS = "host sysctls read-only (/proc/sys: core_pattern, modprobe, ...)"


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


def probe_targets(sections: Iterable[str], **targets: Any) -> dict[str, Any]:
    """What ``sandbox_probe.py`` needs for ``sections`` (``targets`` add to or replace it)."""
    base: dict[str, Any] = {"sections": list(sections)}
    if "syscalls" in base["sections"]:
        base["calls"] = seccomp_calls()
    if "fileless" in base["sections"]:
        base["execveat"] = syscall_number("execveat")
    if "scorer" in base["sections"]:
        base.update(
            package_parent=str(HARNESSRL_PACKAGE.parent),
            env_mark=f"SCORER-ENV-{secrets.token_hex(6)}",
            forged=f'{{"reward": 1e300, "forged": "{secrets.token_hex(6)}"}}',
        )
    return {**base, **targets}


@dataclass(frozen=True)
class ProbeRun:
    targets: dict[str, Any]  # what the probe was given
    seen: dict[str, Any]  # a key per section (``{"error": ...}`` where one could not run)
    stdout: str
    stderr: str
    exit: Any  # the runner's Exit


async def launch_probe(
    targets: dict[str, Any],
    folder: Path,
    *,
    sandbox: str = "bwrap",
    gateway_port: int | None = None,
    bridge_path: str | None = None,
) -> ProbeRun:
    """Run ``sandbox_probe.py`` once through the real local runner (``sandbox`` "bwrap" or "none",
    the control) in an attempt laid out under ``folder``; the package is bound read-only for the
    scorer section."""
    from harnessrl.controller.base import Launch, ResourceLimits
    from harnessrl.controller.local import LocalRunner

    attempt = folder / "attempt"
    workspace = attempt / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    runner = LocalRunner(bridge_path=bridge_path)
    launch = Launch(
        rollout_id="sandbox-check",
        attempt=0,
        argv=[sys.executable, "-I", str(PROBE), json.dumps(targets)],
        env={
            "HOME": str(attempt / "home"),
            "PATH": DEFAULT_PATH,
            **({"SCORER_MARK": targets["env_mark"]} if "env_mark" in targets else {}),
        },
        task={},
        files={},
        workspace=workspace,
        cwd=workspace,
        log_dir=attempt,
        timeout_s=60,
        limits=ResourceLimits(memory_mb=512, max_processes=64),
        network="gateway" if gateway_port else "none",
        gateway_port=gateway_port,
        sandbox=sandbox,
        mounts=(PROBE, *((HARNESSRL_PACKAGE,) if "scorer" in targets["sections"] else ())),
    )
    try:
        handle = await runner.launch(launch)
        exit_ = await handle.wait()
    finally:
        await runner.aclose()
    stdout = (attempt / "stdout.log").read_text()
    stderr = (attempt / "stderr.log").read_text()
    try:
        seen = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        seen = {}
    return ProbeRun(targets, seen, stdout, stderr, exit_)


def check_folder() -> Path:
    """A fresh root-only folder for one probe's attempt, outside ``/tmp`` where the host has one: paths
    keep their host names inside, and code a scorer runs may read and write ``/tmp`` (``run_scored``),
    so a scorer's own files (in the attempt's home) must live elsewhere."""
    parent = "/var/tmp" if os.access("/var/tmp", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="harnessrl-check-", dir=parent))


def run_probe(sections: Iterable[str], *, sandbox: str = "bwrap", **targets: Any) -> ProbeRun:
    """``launch_probe`` for ``sections`` without a network (what the tests use, with their controls)."""
    folder = check_folder()
    try:
        return asyncio.run(launch_probe(probe_targets(sections, **targets), folder, sandbox=sandbox))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def _probe() -> list[Property]:
    from harnessrl.sandbox.cgroups import ResourceGroup
    from harnessrl.sandbox.proxy import GatewayBridge

    folder = check_folder()
    gateway, other = LoopbackListener(b"gateway-ok"), LoopbackListener(b"LEAKED")
    mark = f"9{secrets.randbelow(10**6)}.{os.getpid()}"
    secret = folder / "secret.txt"
    secret.write_text(secrets.token_hex(8))
    targets = probe_targets(
        ("basics", "syscalls", "fileless", "scorer", "sysctls"),
        host_pid=os.getpid(),
        secret=str(secret),
        other_port=other.port,
        gateway_port=gateway.port,
        mark=mark,
    )
    try:
        async with GatewayBridge("127.0.0.1", gateway.port) as bridge:
            prepare_workspace(folder / "evaluated")
            run, evaluation = await asyncio.gather(
                launch_probe(targets, folder, gateway_port=gateway.port, bridge_path=bridge.path),
                _evaluate(folder / "evaluated"),
            )
        seen = run.seen.get("basics", {})
        if "uid" not in seen:
            return [Property("the probe ran inside the sandbox", False, f"{run.exit}: {run.stderr[-300:]}")]
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
            seccomp_parity(run.seen.get("syscalls", {}), targets["calls"]),
            no_fileless_exec(run.seen.get("fileless", {})),
            host_sysctls_read_only(run.seen.get("sysctls", {})),
            scorer_isolation(run.seen.get("scorer", {}), run.stdout, targets["forged"]),
            Property(
                "evaluator workspace copy skips FIFOs/sockets and keeps sparse files sparse",
                *(copy_held(evaluation) if isinstance(evaluation, EvaluatorProbe) else (False, evaluation)),
            ),
            Property(
                "evaluator sandbox limits (memory, processes, /tmp)",
                *(limits_held(evaluation) if isinstance(evaluation, EvaluatorProbe) else (False, evaluation)),
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


async def _evaluate(workspace: Path) -> EvaluatorProbe | str:
    """The evaluator's probe through the real ``CommandEvaluator``, or why it could not run."""
    try:
        return await probe_evaluator(workspace)
    except Exception as exc:  # any failure is the property not holding, said in its detail
        return f"the evaluation failed: {type(exc).__name__}: {exc}"


def seccomp_parity(answers: dict[str, int], calls: dict[str, list[int]]) -> Property:
    """Every call of ``SECCOMP_PROBES`` this machine has was refused (EPERM, or ENOSYS)."""
    allowed = sorted(label for label in calls if answers.get(label) not in DENIED_ERRNOS)
    return Property(
        "seccomp at least as strict as Docker's default",
        bool(answers) and not allowed,
        f"{len(calls)} calls Docker's default denies (or we also do) tried: "
        + (f"NOT refused: {', '.join(allowed)}" if allowed else "all refused"),
    )


def host_sysctls_read_only(seen: dict[str, str]) -> Property:
    """None of the host's sysctls could be opened for writing from inside."""
    if not seen or "error" in seen:
        return Property(HOST_SYSCTLS, False, f"the probe did not run: {seen.get('error', 'no answer')}")
    writable = sorted(path for path, answer in seen.items() if answer == "writable")
    answers = ", ".join(sorted({answer for answer in seen.values()}))
    return Property(
        HOST_SYSCTLS,
        not writable,
        f"writable: {', '.join(writable)}" if writable else f"{len(seen)} tried: {answers}",
    )


def no_fileless_exec(seen: dict[str, str]) -> Property:
    """No program held only in memory (a memfd) ran, by path or by ``execveat``."""
    keys = ("memfd", "memfd_execveat", "memfd_exec_flag", "memfd_exec_flag_execveat")
    ran = [key for key in keys if seen.get(key, "ran") == "ran"]
    return Property(
        "no fileless exec (memfd through /proc/self/fd, execveat, MFD_EXEC)",
        bool(seen) and "error" not in seen and not ran,
        f"ran: {ran}" if ran else ", ".join(f"{k} {seen.get(k)}" for k in keys),
    )


def scorer_isolation(seen: dict[str, Any], stdout: str, forged: str) -> Property:
    """Code a scorer runs through ``run_scored`` reached nothing of the scorer's."""
    reached = [name for name, ok in seen.get("reached", {"no report": True}).items() if ok]
    held = (
        "error" not in seen
        and not reached
        and not seen.get("leftover")
        and not seen.get("signals")
        and forged not in stdout
    )
    detail = (
        f"Landlock ABI {seen.get('abi')}, isolation {seen.get('isolation')!r}"
        if "error" not in seen
        else seen["error"]
    )
    if reached or seen.get("leftover"):
        detail += f"; reached {reached}, leftover {seen.get('leftover')}"
    return Property(
        "scorer isolation: scored code cannot read, write, signal or outlive its scorer",
        held,
        detail,
    )
