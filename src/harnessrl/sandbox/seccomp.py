"""The seccomp filter every sandboxed process runs under, compiled to BPF with libseccomp.

The filter is a deny list on top of bubblewrap's namespaces: it closes the system calls an agent
would use to leave or look outside its namespaces (``setns``, ``mount``, ``unshare``, new namespaces
through ``clone``), to read other processes (``ptrace``, ``process_vm_readv``), or to reach kernel
attack surface no harness needs (``bpf``, ``keyctl``, ``perf_event_open``, module loading,
``userfaultfd``). Denied calls fail with ``EPERM`` rather than killing the process, so a harness
that merely probes (Node, Python's ``os.cpu_count`` fallbacks) keeps running. ``clone3`` answers
``ENOSYS``: its flags live in memory a filter cannot read, and glibc then falls back to ``clone``,
whose flags the filter can check. System calls of foreign architectures (32-bit ``int 0x80``) kill
the process (libseccomp's default for an architecture the filter does not list).

libseccomp comes from the system (Debian ``libseccomp2``); ``pyseccomp`` is its ctypes binding.
"""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from pathlib import Path

# Denied outright (EPERM). Each line says why a harness has no use for it.
DENIED_SYSCALLS: tuple[str, ...] = (
    "setns",  # join another namespace (the host's network, via /proc/<pid>/ns/net)
    "unshare",  # make new namespaces (a user namespace would give capabilities inside it)
    "mount",  # remount a read-only bind writable, mount cgroupfs/proc to raise limits
    "umount2",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    "pivot_root",
    "chroot",
    "ptrace",  # read other processes' memory (a secret held by a sibling harness process)
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",  # steal another process's file descriptors
    "bpf",
    "perf_event_open",
    "keyctl",  # the kernel keyring is shared across namespaces
    "add_key",
    "request_key",
    "userfaultfd",  # a classic exploitation primitive
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "open_by_handle_at",  # reach files outside the mount namespace by inode handle
    "name_to_handle_at",
    "iopl",
    "ioperm",
    "swapon",
    "swapoff",
    "reboot",
    "settimeofday",
    "clock_settime",
    "adjtimex",
    "quotactl",
    "lookup_dcookie",
    "vhangup",
    "acct",
    "syslog",
)

# clone() flags that create namespaces: any one set makes the call fail.
CLONE_NAMESPACE_FLAGS: tuple[int, ...] = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
    0x00000080,  # CLONE_NEWTIME
)
TIOCSTI = 0x5412  # push characters into the controlling terminal's input (a classic sandbox escape)


def compile_filter() -> bytes:
    """The filter as a BPF program (what ``bwrap --seccomp FD`` reads)."""
    import pyseccomp as seccomp  # needs the system's libseccomp; imported only where a sandbox starts

    filt = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    deny = seccomp.ERRNO(errno.EPERM)
    for name in DENIED_SYSCALLS:
        try:
            filt.add_rule(deny, name)
        except (OSError, RuntimeError, ValueError):  # a call this architecture does not have
            continue
    for flag in CLONE_NAMESPACE_FLAGS:
        filt.add_rule(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    filt.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    filt.add_rule(deny, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, TIOCSTI))
    with tempfile.TemporaryFile() as out:
        filt.export_bpf(out)
        out.seek(0)
        return out.read()


def filter_file(folder: Path) -> Path:
    """The compiled filter, written once into ``folder`` (root-only) and reused by every attempt."""
    program = compile_filter()
    path = folder / f"seccomp-{hashlib.sha256(program).hexdigest()[:12]}.bpf"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(program)
        tmp.replace(path)
    return path
