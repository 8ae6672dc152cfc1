"""Confining a forked child before it touches untrusted input: ``prepare`` once, ``Confinement.enter``
per child.

A long-lived parent (a scorer process that has imported its libraries and computed what scoring needs)
forks one child per untrusted input. Before the child reads that input it gives up, for good:

- **its descriptors**: all but the one it reports on (stdin/stdout/stderr become ``/dev/null``);
- **its privileges**: as root, it becomes ``nobody`` where the Python install is readable to others,
  else it keeps uid 0 with no capabilities; ``no_new_privs``; ``PR_SET_PDEATHSIG`` so it dies with
  its parent;
- **the filesystem**: a Landlock domain (``landlock.restrict``) that may read only the system's
  libraries (``/usr``, ``/lib*``) and Python's install, and write, create or execute nothing;
- **the network and its neighbours**: Landlock denies TCP connect/bind (ABI >= 4) and signals or
  abstract Unix sockets outside the domain (ABI >= 6); a seccomp filter of its own denies creating
  sockets, sending signals, starting processes, ``execve``, ``ptrace`` and opening files for writing,
  on any ABI;
- **the sandbox's seccomp filter** (``seccomp.py``, what harnesses run under), stacked with that one;
- **resources**: ``RLIMIT_CPU`` (the time limit), ``RLIMIT_AS`` (its parent's address space plus a
  budget), no core files, no file growth, few descriptors.

``Confinement.missing`` names what this machine cannot provide (no Landlock, no libseccomp): callers
decide whether scoring may go on without it. ``isolation_problem`` is the same check for a config
validator, without preparing anything.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import resource
import signal
import stat
import sys
from dataclasses import dataclass, field

from harnessrl.sandbox import landlock

NOBODY = 65534
_SYSTEM_READ = ("/usr", "/lib", "/lib32", "/lib64", "/libx32")
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_LANDLOCK_CREATE_RULESET = 444  # the same number on x86_64 and aarch64 (the generic table)
_LANDLOCK_RESTRICT_SELF = 446
_NET_BIND_TCP = 1 << 0
_NET_CONNECT_TCP = 1 << 1
_CAP_VERSION_3 = 0x20080522
_CLONE_THREAD = 0x00010000
_FD_CEILING = 1 << 30  # closerange's end: Python uses close_range(2), so the size costs nothing

# Denied with EPERM by the confined child's own filter, on top of the sandbox's allow list.
_DENIED: tuple[str, ...] = (
    *("socket", "socketpair", "connect", "bind", "listen", "accept", "accept4"),
    *("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open"),
    *("pidfd_send_signal", "pidfd_getfd", "fork", "vfork", "execve", "execveat", "ptrace"),
    *("process_vm_readv", "process_vm_writev", "creat", "truncate", "mkdir", "mkdirat", "rmdir"),
    *("unlink", "unlinkat", "rename", "renameat", "renameat2", "link", "linkat", "symlink"),
    *("symlinkat", "mknod", "mknodat", "chmod", "fchmodat", "chown", "fchownat", "lchown"),
    *("setsid", "setpgid", "unshare", "setns", "mount", "chroot"),
)


class ConfinementError(OSError):
    """A child could not be confined (the kernel refused a step): nothing untrusted was read yet."""


@dataclass(frozen=True)
class Confinement:
    """What each forked child enters, prepared once in the parent."""

    readable: tuple[str, ...]
    landlock_abi: int
    seccomp_programs: tuple[bytes, ...] = ()
    uid: int | None = None  # drop to this uid and gid; None: keep the parent's
    drop_capabilities: bool = False
    missing: tuple[str, ...] = field(default=())  # what this machine could not provide

    @property
    def level(self) -> str:
        """``"full"``, or what is missing (``"no landlock, no seccomp"``)."""
        return "full" if not self.missing else ", ".join(f"no {m}" for m in self.missing)

    def enter(self, keep_fd: int, *, cpu_seconds: int, memory_bytes: int) -> int:
        """Confine this (freshly forked) process; return the number ``keep_fd`` now has (3).
        Raises ``ConfinementError`` when a step fails: the caller must then exit without reading
        anything untrusted."""
        try:
            return self._enter(keep_fd, cpu_seconds, memory_bytes)
        except OSError as exc:
            raise ConfinementError(exc.errno or 0, f"confinement failed: {exc}") from exc

    def _enter(self, keep_fd: int, cpu_seconds: int, memory_bytes: int) -> int:
        parent = os.getppid()
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before PDEATHSIG was set
            os._exit(1)
        if keep_fd < 3:
            raise OSError(errno.EBADF, f"the descriptor to keep must not be stdin/stdout/stderr ({keep_fd})")
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        if keep_fd != 3:
            os.dup2(keep_fd, 3)  # over null itself if it was 3: 0-2 keep their copies
        os.closerange(4, _FD_CEILING)
        with open("/proc/self/statm", "rb") as statm:
            vsize = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        for limit, value in (
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_FSIZE, 0),
            (resource.RLIMIT_NOFILE, 32),
            (resource.RLIMIT_AS, vsize + memory_bytes),
        ):
            resource.setrlimit(limit, (value, value))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
        if self.uid is not None:
            os.setgroups([])
            os.setresgid(self.uid, self.uid, self.uid)
            os.setresuid(self.uid, self.uid, self.uid)
            resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
        elif self.drop_capabilities:
            _drop_capabilities()
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
        if self.landlock_abi >= 1:
            read = landlock.READ_FILE | landlock.READ_DIR
            landlock.restrict(
                rules=dict.fromkeys(self.readable, read),
                handled=read | landlock.WRITE | landlock.EXECUTE,
                scoped=landlock.SCOPE_SIGNAL | landlock.SCOPE_ABSTRACT_UNIX_SOCKET,
                abi=self.landlock_abi,
            )
            if self.landlock_abi >= 4:
                _deny_tcp(self.landlock_abi)
        for program in self.seccomp_programs:
            _load_seccomp(program)
        return 3


def prepare() -> Confinement:
    """The confinement this machine supports, for children forked from this process."""
    readable = tuple(sorted({*_SYSTEM_READ, *_python_paths()}))
    missing = []
    abi = landlock.abi_version()
    if abi < 1:
        missing.append("landlock")
    programs: tuple[bytes, ...] = ()
    try:
        programs = _seccomp_programs()
    except (ImportError, OSError, RuntimeError, ValueError):
        missing.append("seccomp")
    uid, drop = None, False
    if os.geteuid() == 0:
        if all(_readable_by_others(p) for p in readable if os.path.exists(p)):
            uid = NOBODY
        else:  # e.g. Python under /root (0700): keep uid 0, with no capabilities
            drop = True
    return Confinement(readable, abi, programs, uid, drop, tuple(missing))


def isolation_problem() -> str | None:
    """Why a forked child cannot be fully confined on this machine, or None."""
    problems = []
    if landlock.abi_version() < 1:
        problems.append("the kernel has no Landlock (Linux >= 5.13 with landlock in the LSM list)")
    try:
        import pyseccomp  # noqa: F401  (needs the system's libseccomp)
    except (ImportError, OSError, RuntimeError) as exc:
        problems.append(f"libseccomp is not usable ({exc}): install libseccomp2 and pyseccomp")
    return "; ".join(problems) or None


def _python_paths() -> set[str]:
    return {
        sys.prefix,
        sys.base_prefix,
        os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))),
    }


def _readable_by_others(path: str) -> bool:
    """Whether a process of another uid can reach ``path`` (every folder above it searchable)."""
    current = os.path.realpath(path)
    if not os.stat(current).st_mode & stat.S_IROTH:
        return False
    while current != "/":
        current = os.path.dirname(current)
        if not os.stat(current).st_mode & stat.S_IXOTH:
            return False
    return True


def _seccomp_programs() -> tuple[bytes, ...]:
    import tempfile

    import pyseccomp as seccomp

    from harnessrl.sandbox.seccomp import compile_filter

    filt = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    deny = seccomp.ERRNO(errno.EPERM)
    for name in _DENIED:
        with contextlib.suppress(OSError, RuntimeError, ValueError):  # unknown here: the allow list has it
            filt.add_rule(deny, name)
    # Threads may start (CLONE_THREAD); processes may not.
    filt.add_rule(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, _CLONE_THREAD, 0))
    # Open for reading only: any of these flags means writing or creating.
    for flag in (os.O_WRONLY, os.O_RDWR, os.O_CREAT, os.O_TRUNC, os.O_APPEND):
        filt.add_rule(deny, "openat", seccomp.Arg(2, seccomp.MASKED_EQ, flag, flag))
        with contextlib.suppress(OSError, RuntimeError, ValueError):  # no open(2) on aarch64
            filt.add_rule(deny, "open", seccomp.Arg(1, seccomp.MASKED_EQ, flag, flag))
    filt.add_rule(seccomp.ERRNO(errno.ENOSYS), "openat2")  # flags in memory: glibc falls back to openat
    with tempfile.TemporaryFile() as out:
        filt.export_bpf(out)
        out.seek(0)
        own = out.read()
    return (compile_filter(), own)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)):
        code = ctypes.get_errno()
        raise OSError(code, f"prctl({option}): {os.strerror(code)}")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _load_seccomp(program: bytes) -> None:
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))  # 8 bytes per BPF instruction
    if _libc.prctl(_PR_SET_SECCOMP, ctypes.c_ulong(_SECCOMP_MODE_FILTER), ctypes.byref(fprog), 0, 0):
        code = ctypes.get_errno()
        raise OSError(code, f"seccomp: {os.strerror(code)}")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


def _deny_tcp(abi: int) -> None:
    """A nested Landlock domain that handles TCP bind and connect and allows neither (ABI >= 4)."""
    attr = _RulesetAttr(0, _NET_BIND_TCP | _NET_CONNECT_TCP, 0)
    size = 16 if abi < landlock.SCOPE_ABI else 24
    ruleset = _libc.syscall(_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"landlock net ruleset: {os.strerror(code)}")
    try:
        if _libc.syscall(_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"landlock net restrict_self: {os.strerror(code)}")
    finally:
        os.close(ruleset)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _drop_capabilities() -> None:
    """Empty effective, permitted and inheritable sets (ambient ones go with permitted)."""
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.capset(ctypes.byref(header), data):
        code = ctypes.get_errno()
        raise OSError(code, f"capset: {os.strerror(code)}")
