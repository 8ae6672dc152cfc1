"""What ``harnessrl sandbox check`` runs inside a sandbox: ``python -I sandbox_probe.py TARGETS_JSON``.

Each section tries one group of properties from inside and reports what it saw (never a verdict:
the host side decides, ``sandbox_check.py``); the last stdout line is one JSON object, a key per
section. ``TARGETS_JSON`` says which sections to run and what to aim at (the host's pid, a secret's
path, a port, the system call numbers to try). The same script run with ``sandbox = "none"`` is the
control the tests use: there the attacks must work, which shows that each probe notices success.

Standard library only (the project is not visible inside a sandbox), except the scorer section,
which imports ``harnessrl.sandbox.scored`` from the package folder the check binds in for it.
"""

import contextlib
import ctypes
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def _status_field(name: str) -> str:
    with open("/proc/self/status") as f:
        return next(line.split()[1] for line in f if line.startswith(name + ":"))


def _denied(call) -> bool:
    try:
        return call() != 0
    except OSError:
        return True


def basics(t: dict) -> dict:
    """Identity, the classic escape calls, what is visible, the network, and a daemon to outlive us."""
    out: dict = {
        "uid": os.getuid(),
        "cap_eff": _status_field("CapEff"),
        "no_new_privs": _status_field("NoNewPrivs"),
        "seccomp": _status_field("Seccomp"),
        "setns_denied": _denied(lambda: libc.setns(os.open("/proc/self/ns/net", os.O_RDONLY), 0)),
        "unshare_denied": _denied(lambda: libc.unshare(0x10000000)),
        "mount_denied": _denied(lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
        "ptrace_denied": _denied(lambda: libc.ptrace(16, 1, None, None)),
        "pids": len([p for p in os.listdir("/proc") if p.isdigit()]),
        "secret_visible": os.path.exists(t["secret"]),
        "cgroupfs_visible": os.path.exists("/sys/fs/cgroup"),
    }
    try:
        with open(f"/proc/{t['host_pid']}/cmdline", "rb") as f:
            out["host_pid_visible"] = b"harnessrl" in f.read()
    except OSError:
        out["host_pid_visible"] = False
    try:
        with open("/usr/.harnessrl-check", "w"):
            out["usr_writable"] = True
    except OSError:
        out["usr_writable"] = False
    with open("ws-ok", "w") as f:
        out["workspace_writable"] = f.write("ok") == 2
    try:
        socket.create_connection(("127.0.0.1", t["other_port"]), timeout=3).close()
        out["other_port"] = True
    except OSError:
        out["other_port"] = False
    try:
        url = f"http://127.0.0.1:{t['gateway_port']}/"
        out["gateway"] = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError as exc:
        out["gateway"] = repr(exc)
    subprocess.Popen(["setsid", "sleep", t["mark"]], start_new_session=True)
    return out


def syscalls(calls: dict) -> dict:
    """``{label: [number, *args]}`` -> ``{label: errno}`` (0: the call succeeded). The arguments are
    chosen so that, where a call is allowed, the kernel fails it harmlessly (a bad address, an
    invalid flag) or it does nothing (a zero length); personas are restored after the call."""
    with contextlib.suppress(OSError):
        os.setsid()  # no controlling terminal: vhangup() has nothing to hang up
    answers = {}
    for label, (number, *args) in calls.items():
        persona = libc.personality(0xFFFFFFFF)
        result = libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in args))
        answers[label] = ctypes.get_errno() if result == -1 else 0
        libc.personality(persona)
    return answers


def _exec_status(path_or_fd, execveat_nr: int | None = None) -> str:
    """Run ``true`` from ``path_or_fd`` in a child: "ran", or the errno name of the refusal."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            if execveat_nr is None:
                os.execv(path_or_fd, ["true"])
            argv = (ctypes.c_char_p * 2)(b"true", None)
            envp = (ctypes.c_char_p * 1)(None)
            libc.syscall(ctypes.c_long(execveat_nr), path_or_fd, b"", argv, envp, 0x1000)  # AT_EMPTY_PATH
            code = ctypes.get_errno()
        except OSError as exc:
            code = exc.errno
        os.write(write, str(code).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        said = f.read()
    _, status = os.waitpid(pid, 0)
    if said:
        return errno.errorcode.get(int(said), said)
    return "ran" if os.waitstatus_to_exitcode(status) == 0 else f"exited {os.waitstatus_to_exitcode(status)}"


def fileless(t: dict) -> dict:
    """Execute a copy of ``/bin/true`` held only in memory: a memfd through ``/proc/self/fd/N`` and
    through ``execveat(fd, "", AT_EMPTY_PATH)``, and a memfd asked for as executable (MFD_EXEC)."""
    with open("/bin/true", "rb") as f:
        program = f.read()
    out = {}
    try:
        with open("/proc/sys/vm/memfd_noexec") as f:
            out["memfd_noexec"] = f.read().strip()  # this PID namespace's value (Linux 6.3+)
    except OSError as exc:
        out["memfd_noexec"] = exc.strerror
    for label, flags in (("memfd", 0), ("memfd_exec_flag", 0x10)):  # MFD_EXEC
        fd = libc.memfd_create(b"payload", flags)
        if fd < 0:
            refused = errno.errorcode.get(ctypes.get_errno(), "?")
            out[label] = out[label + "_execveat"] = f"memfd_create: {refused}"
            continue
        os.write(fd, program)
        out[label] = _exec_status(f"/proc/self/fd/{fd}")
        out[label + "_execveat"] = _exec_status(fd, t["execveat"])
        os.close(fd)
    return out


def proc_mem(t: dict) -> dict:
    """Which processes' memory this process can open: a child of its own, and the sandbox's pid 1."""
    child = subprocess.Popen(["sleep", "30"])
    out = {}
    try:
        for label, pid in (("child", child.pid), ("pid1", 1)):
            try:
                with open(f"/proc/{pid}/mem", "rb"):
                    out[label] = "opened"
            except OSError as exc:
                out[label] = exc.strerror
    finally:
        child.kill()
        child.wait()
    return out


# Code under test for the scorer section: it attacks the scorer (its pid and targets in argv).
_SCORED = r"""
import json, os, signal, sys, time
scorer, t = int(sys.argv[1]), json.loads(sys.argv[2])
found = {}
def attempt(name, action):
    try:
        action()
        found[name] = True
    except OSError as exc:
        found[name] = False
def read(path):
    with open(path, "rb") as f:
        return f.read(4096)
def environ():
    if t["env_mark"].encode() not in read(f"/proc/{scorer}/environ"):
        raise OSError("read, but not the scorer's environment")
attempt("environ", environ)
attempt("mem", lambda: open(f"/proc/{scorer}/mem", "r+b").close())
attempt("stdout", lambda: open(f"/proc/{scorer}/fd/1", "a").write(t["forged"] + "\n"))
attempt("signal", lambda: os.kill(scorer, signal.SIGUSR1))
attempt("secret", lambda: read(t["secret"]))
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(30)  # then it would write a verdict; the scorer looks for it alive
    os._exit(0)
print(json.dumps(found), flush=True)
"""


def _processes_running(script: str) -> list[int]:
    """Live processes (not zombies) whose command line names ``script``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                named = script.encode() in f.read()
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        if named and stat[stat.rfind(b")") + 2 :][:1] != b"Z":
            found.append(int(entry))
    return found


def scorer(t: dict) -> dict:
    """Be a scorer: keep a secret file and a marked environment, run code under test through
    ``run_scored`` (or, with ``t["plain"]``, a plain subprocess: the control), and report what that
    code reached: the scorer's environment, memory, stdout, a signal, the secret, and whether a
    process it left is still alive once the scorer goes on."""
    sys.path.insert(0, t["package_parent"])
    from harnessrl.sandbox import landlock
    from harnessrl.sandbox.scored import run_scored

    home = os.environ["HOME"]
    os.environ["HARNESSRL_SCORER_DIR"] = os.path.join(home, "scorer")
    os.makedirs(os.environ["HARNESSRL_SCORER_DIR"], exist_ok=True)
    if os.environ.get("SCORER_MARK") != t["env_mark"]:  # what the scored code looks for in its environ
        raise RuntimeError("the scorer was started without SCORER_MARK in its environment")
    secret = os.path.join(home, "scorer-only.txt")
    with open(secret, "w") as f:
        f.write("what the tests expect")
    signals = []
    signal.signal(signal.SIGUSR1, lambda *_: signals.append(1))
    scratch = os.path.abspath("scored")
    os.makedirs(scratch, exist_ok=True)
    code = os.path.join(scratch, "attack.py")
    with open(code, "w") as f:
        f.write(_SCORED)
    targets = {**t, "secret": secret}
    argv = [sys.executable, "-I", code, str(os.getpid()), json.dumps(targets)]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp"}
    out: dict = {"abi": landlock.abi_version()}
    if t.get("plain"):
        # Output to a file, not a pipe: the process it leaves would hold a pipe open for 30 s.
        with open(os.path.join(scratch, "output"), "w+b") as f:
            subprocess.run(argv, cwd=scratch, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=30)
            f.seek(0)
            output = f.read()
        out["isolation"] = "none"
    else:
        run = run_scored(argv, cwd=Path(scratch), env=env, timeout_s=30)
        output = run.output
        out["isolation"] = run.isolation
    lines = output.decode(errors="replace").strip().splitlines()
    out["reached"] = json.loads(lines[-1]) if lines else {"no report": True}
    # A process the code left behind, still alive now that its scorer goes on, could write later.
    out["leftover"] = [pid for pid in _processes_running(code) if pid != os.getpid()]
    out["signals"] = len(signals)
    return out


#: Host-wide sysctls (not one namespace's): a pipe in ``core_pattern`` runs as root on the host at the
#: next crash, ``modprobe`` at the next unknown binary format; the rest change the whole machine.
HOST_SYSCTLS = (
    "/proc/sys/kernel/core_pattern",
    "/proc/sys/kernel/modprobe",
    "/proc/sys/vm/drop_caches",
    "/proc/sys/kernel/randomize_va_space",
    "/proc/sys/fs/file-max",
)


def sysctls(t: dict) -> dict:
    """Which host sysctls this process can open for writing (opened, closed, never written): the
    sandbox user is the controller's uid, mapped, so each file's mode alone decides."""
    out = {}
    for path in HOST_SYSCTLS:
        try:
            os.close(os.open(path, os.O_WRONLY))
            out[path] = "writable"
        except OSError as exc:
            out[path] = errno.errorcode.get(exc.errno, str(exc.errno))
    return out


SECTIONS = {"basics": basics, "syscalls": lambda t: syscalls(t["calls"]), "fileless": fileless}
SECTIONS.update(proc_mem=proc_mem, scorer=scorer, sysctls=sysctls)


def main(argv: list[str]) -> int:
    targets = json.loads(argv[1])
    out = {}
    for name in targets["sections"]:
        try:
            out[name] = SECTIONS[name](targets)
        except Exception as exc:  # a section that could not run says why; the host treats it as failed
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
