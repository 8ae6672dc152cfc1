"""How ``harnessrl sandbox check`` calls each system call the seccomp filter must refuse.

``SECCOMP_PROBES`` names every system call Docker's default seccomp profile does not allow a
container without added capabilities (the comparison itself is written out, with its source, in
``tests/sandbox/test_seccomp.py``), and the few more the sandbox denies. ``sandbox_probe.py``
makes each call from inside a sandbox with the arguments given here; the host resolves the numbers
(``seccomp_calls``), since the probe cannot import libseccomp there.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable

# label -> (system call, arguments). The arguments make a call that is let through fail harmlessly or
# do nothing, even for root (the control runs without a sandbox): ``B`` is a bad address, ``-1`` a
# bad descriptor; a persona is restored by the probe.
B = 1
SECCOMP_PROBES: dict[str, tuple[str, tuple[int, ...]]] = {
    "socket(AF_ALG)": ("socket", (38, 999, 0)),
    "socket(AF_VSOCK)": ("socket", (40, 999, 0)),
    "clone(CLONE_NEWUSER)": (
        "clone",
        (0x10000000 | 0x200, 0, 0, 0, 0),
    ),  # with CLONE_FS: EINVAL if let through
    "clone(CLONE_NEWNET)": ("clone", (0x40000000 | 0x200 | 0x20000, 0, 0, 0, 0)),
    "clone3": ("clone3", (B, 0)),
    "personality(READ_IMPLIES_EXEC)": ("personality", (0x0400000,)),
    "personality(ADDR_NO_RANDOMIZE)": ("personality", (0x0040000,)),
    "syslog": ("syslog", (10, 0, 0)),  # SYSLOG_ACTION_SIZE_BUFFER
    "uselib": ("uselib", (B,)),
    "ustat": ("ustat", (0, B)),
    "sysfs": ("sysfs", (99,)),
    "vhangup": ("vhangup", ()),
    "pivot_root": ("pivot_root", (B, B)),
    "_sysctl": ("_sysctl", (B,)),
    "chroot": ("chroot", (B,)),
    "acct": ("acct", (B,)),
    "settimeofday": ("settimeofday", (B, 0)),
    "clock_settime": ("clock_settime", (999, B)),
    "mount": ("mount", (B, B, B, 0, 0)),
    "umount2": ("umount2", (B, 0)),
    "swapon": ("swapon", (B, 0)),
    "swapoff": ("swapoff", (B,)),
    "reboot": ("reboot", (0, 0, 0, 0)),
    "sethostname": ("sethostname", (B, 1)),
    "setdomainname": ("setdomainname", (B, 1)),
    "iopl": ("iopl", (4,)),
    "ioperm": ("ioperm", (65536, 1, 0)),
    "init_module": ("init_module", (0, 0, 0)),
    "finit_module": ("finit_module", (-1, B, 0)),
    "delete_module": ("delete_module", (B, 0)),
    "create_module": ("create_module", ()),
    "get_kernel_syms": ("get_kernel_syms", ()),
    "query_module": ("query_module", ()),
    "nfsservctl": ("nfsservctl", ()),
    "getpmsg": ("getpmsg", ()),
    "putpmsg": ("putpmsg", ()),
    "afs_syscall": ("afs_syscall", ()),
    "tuxcall": ("tuxcall", ()),
    "security": ("security", ()),
    "vserver": ("vserver", ()),
    "quotactl": ("quotactl", (0, B, 0, 0)),
    "quotactl_fd": ("quotactl_fd", (-1, 0, 0, 0)),
    "lookup_dcookie": ("lookup_dcookie", (0, B, 0)),
    "kexec_load": ("kexec_load", (0, 0, 0, 0xFFFFFFFF)),
    "kexec_file_load": ("kexec_file_load", (-1, -1, 0, 0, 0xFFFFFFFF)),
    "add_key": ("add_key", (B, B, 0, 0, 0)),
    "request_key": ("request_key", (B, B, 0, 0)),
    "keyctl": ("keyctl", (9999, 0, 0, 0, 0)),
    "mbind": ("mbind", (0, 0, 0, 0, 0, 0)),
    "set_mempolicy": ("set_mempolicy", (0, 0, 0)),  # MPOL_DEFAULT: what the probe has anyway
    "get_mempolicy": ("get_mempolicy", (0, 0, 0, 0, 0)),
    "set_mempolicy_home_node": ("set_mempolicy_home_node", (0, 0, 0, 0)),
    "migrate_pages": ("migrate_pages", (0, 0, 0, 0)),
    "move_pages": ("move_pages", (0, 0, 0, 0, 0, 0)),
    "unshare": ("unshare", (0,)),
    "setns": ("setns", (-1, 0)),
    "perf_event_open": ("perf_event_open", (B, 0, -1, -1, 0)),
    "fanotify_init": ("fanotify_init", (0xFFFFFFFF, 0)),
    "open_by_handle_at": ("open_by_handle_at", (-1, B, 0)),
    "kcmp": ("kcmp", (0, 0, 99, 0, 0)),
    "bpf": ("bpf", (9999, 0, 0)),
    "userfaultfd": ("userfaultfd", (0xFFFFFFFF,)),
    "io_uring_setup": ("io_uring_setup", (0, B)),
    "io_uring_enter": ("io_uring_enter", (-1, 0, 0, 0, 0, 0)),
    "io_uring_register": ("io_uring_register", (-1, 0, 0, 0)),
    "open_tree": ("open_tree", (-1, B, 0)),
    "move_mount": ("move_mount", (-1, B, -1, B, 0)),
    "fsopen": ("fsopen", (B, 0)),
    "fsconfig": ("fsconfig", (-1, 0, 0, 0, 0)),
    "fsmount": ("fsmount", (-1, 0, 0)),
    "fspick": ("fspick", (-1, B, 0)),
    "mount_setattr": ("mount_setattr", (-1, B, 0, 0, 0)),
    "pidfd_getfd": ("pidfd_getfd", (-1, 0, 0)),
    "process_madvise": ("process_madvise", (-1, 0, 0, 0, 0)),
    "lsm_get_self_attr": ("lsm_get_self_attr", (0, 0, B, 0)),
    "lsm_set_self_attr": ("lsm_set_self_attr", (0, B, 0, 0)),
    "lsm_list_modules": ("lsm_list_modules", (B, B, 0)),
    "open_tree_attr": ("open_tree_attr", (-1, B, 0, 0, 0)),
    "file_getattr": ("file_getattr", (-1, B, B, 0, 0)),
    "file_setattr": ("file_setattr", (-1, B, B, 0, 0)),
    # Docker allows these; the sandbox does not.
    "ptrace": ("ptrace", (9999, 0, 0, 0)),
    "process_vm_readv": ("process_vm_readv", (0, 0, 0, 0, 0, 0)),
    "process_vm_writev": ("process_vm_writev", (0, 0, 0, 0, 0, 0)),
    "name_to_handle_at": ("name_to_handle_at", (-1, B, B, B, 0)),
    "execveat": ("execveat", (-1, B, 0, 0, 0)),
    "modify_ldt": ("modify_ldt", (0, 0, 0)),
    "adjtimex": ("adjtimex", (B,)),
    "ioctl(TIOCSTI)": ("ioctl", (-1, 0x5412, 0)),
    "ioctl(TIOCSTI, high bits set)": ("ioctl", (-1, (1 << 32) | 0x5412, 0)),
}
# Calls newer than the system's libseccomp knows (2.5.4 stops at Linux 6.7): numbers from the
# kernel's unified table, the same on x86_64 and aarch64.
NEWER_SYSCALLS = {
    "lsm_get_self_attr": 459,
    "lsm_set_self_attr": 460,
    "lsm_list_modules": 461,
    "open_tree_attr": 467,
    "file_getattr": 468,
    "file_setattr": 469,
}


def syscall_number(name: str) -> int | None:
    """The number of ``name`` on this machine, or None where this architecture has no such call."""
    import pyseccomp as seccomp

    number = seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)
    if number >= 0:
        return number
    return NEWER_SYSCALLS.get(name) if os.uname().machine in ("x86_64", "aarch64") else None


def seccomp_calls(labels: Iterable[str] = SECCOMP_PROBES) -> dict[str, list[int]]:
    """``{label: [number, *args]}`` for the probe, leaving out calls this architecture lacks."""
    calls = {}
    for label in labels:
        name, args = SECCOMP_PROBES[label]
        number = syscall_number(name)
        if number is not None:
            calls[label] = [number, *args]
    return calls


DENIED_ERRNOS = (errno.EPERM, errno.ENOSYS)  # what the filter answers (ENOSYS also: the kernel lacks it)
