"""Landlock: the kernel's unprivileged access control, called through ``ctypes`` (standard library only).

Why here: bubblewrap's namespaces separate a sandbox from the host, but every process *inside* one
sandbox is the same uid with the same view. Landlock adds a boundary inside: a process that calls
``restrict`` enters a new domain, nested in whatever domain it was in, which it and every descendant
keep for life. The kernel then forbids a process to

- ptrace-attach to a process outside its domain, which closes ``/proc/<pid>/mem`` of such a process
  (read-mode checks such as ``environ``, ``maps`` and ``fd`` pass Landlock on this kernel: a scorer
  also makes itself non-dumpable, which closes those to an unprivileged process, see ``scored.py``);
- send it a signal, or connect to its abstract Unix sockets (``scope_*``, Landlock ABI 6);
- open, execute or write files beneath any folder its rules do not allow (only the access rights the
  domain *handles* are restricted; an unhandled right is left alone).

A scorer runs the code it scores in such a domain (``harnessrl.sandbox.scored``): that code can
then neither read, write nor signal the scorer, nor open the scorer's inputs. This file is also run
as a script (``python -I -S landlock.py SPEC -- ARGV``: enter a domain, then exec ``ARGV``), so it
imports nothing but the standard library and starts in milliseconds.

Not closed by Landlock: a ``memfd`` can still be executed (the kernel lets internal filesystems
through a domain that has any rule), and processes of *one* domain can still read each other.

``abi_version()`` is 0 where the kernel has no Landlock (before 5.13, or not enabled); callers
decide what that means for them. Constants are the kernel's UAPI (``linux/landlock.h``).
"""

import ctypes
import os
import platform
import sys

# System call numbers (the same on every architecture that uses the generic table, and on x86_64).
_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# Filesystem access rights, with the ABI version that introduced each.
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
# Rights that make sense on a file (a rule on a file, not a folder, may only grant these).
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV

READ = READ_FILE | READ_DIR
WRITE = (
    WRITE_FILE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_CHAR
    | MAKE_DIR
    | MAKE_REG
    | MAKE_SOCK
    | MAKE_FIFO
    | MAKE_BLOCK
    | MAKE_SYM
    | REFER
    | TRUNCATE
    | IOCTL_DEV
)

# Scopes (ABI 6): what a domain's processes may not reach outside it.
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1
SCOPE_ABI = 6


class LandlockError(OSError):
    """Landlock is missing, or the kernel refused a ruleset (the errno says why)."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)) in the UAPI: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = None


def _syscall(*args):
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    return _libc.syscall(*args)


def abi_version() -> int:
    """The Landlock ABI this kernel offers; 0 if none (not Linux, too old, or disabled at boot)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "aarch64"):
        return 0
    version = _syscall(
        _SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION)
    )
    return max(int(version), 0)


def _fail(what: str) -> LandlockError:
    code = ctypes.get_errno()
    return LandlockError(code, f"landlock {what}: {os.strerror(code)}")


def restrict(
    *,
    rules: dict[str, int],
    handled: int,
    scoped: int = 0,
    abi: int | None = None,
) -> int:
    """Put the calling process (and all it starts from now on) in a new nested Landlock domain.

    ``handled`` is the set of filesystem rights the domain restricts; ``rules`` maps paths to the
    rights allowed beneath them (a path that does not exist is skipped; a file gets only file rights).
    ``scoped`` asks for ``SCOPE_*`` isolation (dropped below ABI 6: check ``abi_version()`` first when
    it matters). Sets ``no_new_privs`` (required without ``CAP_SYS_ADMIN``). Returns the ABI used;
    raises ``LandlockError`` when Landlock is unavailable or the kernel refuses.
    """
    abi = abi_version() if abi is None else abi
    if abi < 1:
        raise LandlockError(0, "landlock is not available on this kernel")
    known = _FS_BY_ABI.get(abi, (1 << 16) - 1)
    attr = _RulesetAttr(handled & known, 0, scoped if abi >= SCOPE_ABI else 0)
    # An older kernel rejects a bigger struct than it knows: pass only the fields this ABI has.
    size = 8 if abi < 4 else (16 if abi < SCOPE_ABI else 24)
    ruleset = _syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise _fail("create_ruleset")
    try:
        for path, allowed in rules.items():
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # nothing there to allow
            try:
                is_dir = os.path.isdir(f"/proc/self/fd/{fd}")
                rights = allowed & attr.handled_access_fs & (~0 if is_dir else _FILE_RIGHTS)
                if not rights:
                    continue
                rule = _PathBeneathAttr(rights, fd)
                if (
                    _syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), _RULE_PATH_BENEATH, ctypes.byref(rule), 0)
                    < 0
                ):
                    raise _fail(f"add_rule({path})")
            finally:
                os.close(fd)
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), 0) < 0:
            raise _fail("prctl(PR_SET_NO_NEW_PRIVS)")
        if _syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            raise _fail("restrict_self")
    finally:
        os.close(ruleset)
    return abi


def _main(argv: list[str]) -> int:
    """``python -I -S landlock.py SPEC STATUS_FD -- ARGV...``: enter the domain ``SPEC`` (JSON:
    ``rules``, ``handled``, ``scoped``) and exec ``ARGV``. Writes ``ok`` to ``STATUS_FD`` (closed by
    the exec) only once the domain holds, so the caller can tell "isolated" from "never started"."""
    import json

    spec, status_fd, sep, command = json.loads(argv[1]), int(argv[2]), argv[3], argv[4:]
    if sep != "--" or not command:
        print("usage: landlock.py SPEC STATUS_FD -- ARGV...", file=sys.stderr)
        return 2
    try:
        restrict(rules=spec["rules"], handled=spec["handled"], scoped=spec["scoped"], abi=spec.get("abi"))
    except LandlockError as exc:
        print(f"harnessrl: cannot isolate the scored code: {exc}", file=sys.stderr, flush=True)
        return 126
    os.set_inheritable(status_fd, False)  # closed by the exec below: EOF tells the caller it happened
    os.write(status_fd, b"ok")
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"harnessrl: cannot start {command[0]!r}: {exc}", file=sys.stderr, flush=True)
    return 127


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
