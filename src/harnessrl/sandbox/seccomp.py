"""The seccomp filter every sandboxed process runs under, compiled to BPF with libseccomp.

The filter is an **allow list**, at least as strict as Docker's default profile (moby's
``profiles/seccomp/default.json``) for a container without added capabilities: every system call
Docker's default does not allow unconditionally is denied here too, and a few it allows are denied
as well (``ptrace``, ``process_vm_readv``/``writev``, ``execveat``, ``name_to_handle_at``,
``modify_ldt``, ``adjtimex``). ``tests/sandbox/test_seccomp.py`` holds the comparison as data and
checks every entry against the compiled program and from inside a real sandbox.

How a denied call answers:

- the calls in ``DENIED_SYSCALLS`` (each with the reason no harness needs it) fail with ``EPERM``, as
  the kernel answers an unprivileged caller, so a harness that merely probes keeps running;
- everything else that is not allowed (obsolete calls, calls newer than this list or than the
  system's libseccomp) answers ``ENOSYS``, as a kernel without them would: callers take the fallback
  they already have for older kernels (glibc does for ``clone3``, ``faccessat2``, ``execveat``...).

Arguments are checked where Docker checks them, and where the kernel truncates a 64-bit register to
32 bits the check looks only at those 32 bits, so a value with high bits set cannot slip past it:
``clone`` with a namespace flag fails; ``clone3`` answers ``ENOSYS`` (its flags live in memory a
filter cannot read; glibc then uses ``clone``); ``personality`` allows only the personas Docker
allows (not ``READ_IMPLIES_EXEC`` nor ``ADDR_NO_RANDOMIZE``); ``socket`` refuses ``AF_ALG`` and
``AF_VSOCK``; ``ioctl(TIOCSTI)`` is denied. System calls of foreign architectures (32-bit ``int
0x80``) kill the process (libseccomp's default for an architecture the filter does not list).

Executing a memfd ("fileless" execution) is closed by the launcher, not here: ``enter.py`` makes
every memfd of the sandbox non-executable (``vm.memfd_noexec = 2`` in a PID namespace of its own);
the filter adds ``execveat`` to the denied calls.

libseccomp comes from the system (Debian ``libseccomp2``); ``pyseccomp`` is its ctypes binding.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import tempfile
from pathlib import Path

# Allowed unconditionally. Docker's default allow list, grouped by what programs use them for, less
# the calls denied below; names this architecture (or the system's libseccomp) does not know are
# skipped, so they answer ENOSYS.
ALLOWED_SYSCALLS: tuple[str, ...] = (
    # files and folders
    *("read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "preadv2", "pwritev"),
    *("pwritev2", "open", "openat", "openat2", "creat", "close", "close_range", "lseek", "dup"),
    *("dup2", "dup3", "fcntl", "flock", "fsync", "fdatasync", "sync", "syncfs", "sync_file_range"),
    *("readahead", "fadvise64", "fallocate", "ftruncate", "truncate", "stat", "lstat", "fstat"),
    *("newfstatat", "statx", "statfs", "fstatfs", "access", "faccessat", "faccessat2", "getdents"),
    *("getdents64", "getcwd", "chdir", "fchdir", "mkdir", "mkdirat", "rmdir", "rename", "renameat"),
    *("renameat2", "link", "linkat", "unlink", "unlinkat", "symlink", "symlinkat", "readlink"),
    *("readlinkat", "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "fchownat"),
    *("lchown", "umask", "utime", "utimes", "utimensat", "futimesat", "mknod", "mknodat"),
    *("copy_file_range", "sendfile", "splice", "tee", "vmsplice", "pipe", "pipe2"),
    *("getxattr", "lgetxattr", "fgetxattr", "setxattr", "lsetxattr", "fsetxattr", "listxattr"),
    *("llistxattr", "flistxattr", "removexattr", "lremovexattr", "fremovexattr", "getxattrat"),
    *("setxattrat", "listxattrat", "removexattrat", "statmount", "listmount"),
    *("inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch", "fanotify_mark"),
    # memory
    *("brk", "mmap", "munmap", "mremap", "mprotect", "pkey_mprotect", "pkey_alloc", "pkey_free"),
    *("madvise", "mincore", "msync", "mlock", "mlock2", "mlockall", "munlock", "munlockall"),
    *("membarrier", "memfd_create", "memfd_secret", "remap_file_pages", "mseal", "map_shadow_stack"),
    *("cachestat", "process_mrelease"),
    # processes, threads, credentials, limits
    *("fork", "vfork", "execve", "exit", "exit_group", "wait4", "waitid", "getpid", "getppid"),
    *("gettid", "getpgid", "setpgid", "getpgrp", "getsid", "setsid", "kill", "tkill", "tgkill"),
    *("pidfd_open", "pidfd_send_signal", "prctl", "arch_prctl", "set_tid_address", "rseq"),
    *("set_robust_list", "get_robust_list", "restart_syscall", "get_thread_area", "set_thread_area"),
    *("seccomp", "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self"),
    *("getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups", "setuid"),
    *("setgid", "setreuid", "setregid", "setresuid", "setresgid", "setfsuid", "setfsgid"),
    *("setgroups", "capget", "capset", "getrlimit", "setrlimit", "prlimit64", "getrusage"),
    *("getpriority", "setpriority", "sched_yield", "sched_getaffinity", "sched_setaffinity"),
    *("sched_getparam", "sched_setparam", "sched_getscheduler", "sched_setscheduler"),
    *("sched_getattr", "sched_setattr", "sched_get_priority_max", "sched_get_priority_min"),
    *("sched_rr_get_interval", "ioprio_get", "ioprio_set", "getcpu", "times", "sysinfo", "uname"),
    # signals, time, waiting
    *("rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigsuspend"),
    *("rt_sigtimedwait", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "sigaltstack", "signalfd"),
    *("signalfd4", "pause", "alarm", "time", "gettimeofday", "clock_gettime", "clock_getres"),
    *("clock_nanosleep", "nanosleep", "clock_adjtime", "getitimer", "setitimer", "timer_create"),
    *("timer_delete", "timer_gettime", "timer_settime", "timer_getoverrun", "timerfd_create"),
    *("timerfd_gettime", "timerfd_settime", "futex", "futex_waitv", "futex_wait", "futex_wake"),
    *("futex_requeue", "select", "pselect6", "poll", "ppoll", "epoll_create", "epoll_create1"),
    *("epoll_ctl", "epoll_ctl_old", "epoll_wait", "epoll_wait_old", "epoll_pwait", "epoll_pwait2"),
    *("eventfd", "eventfd2"),
    # sockets (``socket`` itself is checked below), System V and POSIX IPC, AIO
    *("socketpair", "bind", "listen", "accept", "accept4", "connect", "getsockname", "getpeername"),
    *("getsockopt", "setsockopt", "shutdown", "sendto", "sendmsg", "sendmmsg", "recvfrom"),
    *("recvmsg", "recvmmsg", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop"),
    *("semtimedop", "semctl", "shmget", "shmat", "shmdt", "shmctl", "mq_open", "mq_unlink"),
    *("mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr", "io_setup", "io_destroy"),
    *("io_submit", "io_cancel", "io_getevents", "io_pgetevents"),
    # the rest
    *("getrandom", "uretprobe", "riscv_hwprobe"),
)

# Denied with EPERM. Each line says why a harness has no use for it; (docker) marks the ones Docker's
# default denies too (it allows some with a capability no harness sandbox has).
DENIED_SYSCALLS: dict[str, str] = {
    "setns": "join another namespace, e.g. the host's network via /proc/<pid>/ns/net (docker)",
    "unshare": "make new namespaces: a user namespace would give capabilities inside it (docker)",
    "mount": "remount a read-only bind writable, mount cgroupfs or proc to raise limits (docker)",
    "umount2": "uncover what a mount hides (docker)",
    "move_mount": "the new mount API, same as mount (docker)",
    "open_tree": "the new mount API, same as mount (docker)",
    "fsopen": "the new mount API (docker)",
    "fsmount": "the new mount API (docker)",
    "fsconfig": "the new mount API (docker)",
    "fspick": "the new mount API (docker)",
    "mount_setattr": "clear a mount's read-only flag (docker)",
    "pivot_root": "change the root (docker)",
    "chroot": "change the root, a step of known escapes (docker)",
    "ptrace": "read or write another process's memory, e.g. a secret held by a sibling process",
    "process_vm_readv": "the same without ptrace",
    "process_vm_writev": "write another process's memory without ptrace",
    "process_madvise": "act on another process's memory (docker)",
    "kcmp": "compare another process's descriptors and memory (docker)",
    "pidfd_getfd": "steal another process's file descriptors (docker)",
    "bpf": "load programs into the kernel: large attack surface, reads kernel memory (docker)",
    "perf_event_open": "kernel and hardware tracing; a side channel and frequent CVE source (docker)",
    "fanotify_init": "watch the whole filesystem's accesses (docker)",
    "keyctl": "the kernel keyring is not namespaced (docker)",
    "add_key": "the keyring (docker)",
    "request_key": "the keyring (docker)",
    "userfaultfd": "stall the kernel on a page fault at will: a classic exploitation primitive (docker)",
    "io_uring_setup": "a second syscall interface that seccomp cannot see into; many CVEs (docker)",
    "io_uring_enter": "io_uring (docker)",
    "io_uring_register": "io_uring (docker)",
    "mbind": "NUMA placement: needs CAP_SYS_NICE in Docker, moves the host's memory around (docker)",
    "set_mempolicy": "NUMA policy (docker); ps tries it through libnuma and goes on without it",
    "get_mempolicy": "NUMA policy (docker)",
    "set_mempolicy_home_node": "NUMA policy (docker)",
    "migrate_pages": "move another process's pages between nodes (docker)",
    "move_pages": "move pages, also another process's, between nodes (docker)",
    "init_module": "load kernel modules (docker)",
    "finit_module": "load kernel modules (docker)",
    "delete_module": "unload kernel modules (docker)",
    "kexec_load": "boot another kernel (docker)",
    "kexec_file_load": "boot another kernel (docker)",
    "open_by_handle_at": "reach files outside the mount namespace by inode handle (docker)",
    "name_to_handle_at": "the handles open_by_handle_at takes",
    "execveat": "execute a file descriptor: the usual way to run a memfd (glibc's fexecve falls back "
    "to /proc/self/fd, where the memfd is non-executable)",
    "modify_ldt": "16-bit segments for DOS emulators; a past source of kernel bugs",
    "iopl": "raw I/O ports (docker)",
    "ioperm": "raw I/O ports (docker)",
    "swapon": "the host's swap (docker)",
    "swapoff": "the host's swap (docker)",
    "reboot": "the machine (docker)",
    "settimeofday": "set the host's clock (docker)",
    "clock_settime": "set the host's clock (docker)",
    "adjtimex": "adjust the host's clock",
    "sethostname": "the hostname is fixed by the sandbox (docker)",
    "setdomainname": "the same (docker)",
    "quotactl": "filesystem quotas of the host (docker)",
    "quotactl_fd": "filesystem quotas of the host (docker)",
    "lookup_dcookie": "profiling internals (docker)",
    "vhangup": "hang up the terminal (docker)",
    "acct": "process accounting for the host (docker)",
    "syslog": "read the kernel log: addresses that defeat KASLR (docker)",
}

# clone() flags that create namespaces: any one set makes the call fail.
CLONE_NAMESPACE_FLAGS: tuple[int, ...] = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
    0x00000080,  # CLONE_NEWTIME (only unshare/clone3 take it; in clone's low byte no signal has it)
)
# personality(): PER_LINUX, PER_LINUX32, UNAME26, UNAME26|PER_LINUX32, and 0xffffffff (a query).
# Docker allows these; anything else (READ_IMPLIES_EXEC: every readable mapping executable;
# ADDR_NO_RANDOMIZE: no ASLR) answers ENOSYS.
ALLOWED_PERSONAS: tuple[int, ...] = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
# socket() families denied (EPERM): AF_ALG, the kernel's crypto API (a steady source of CVEs), and
# AF_VSOCK, the host/VM channel. Others up to AF_MCTP (45) are allowed, as in Docker.
DENIED_SOCKET_FAMILIES: tuple[int, ...] = (38, 40)
MAX_SOCKET_FAMILY = 45
TIOCSTI = 0x5412  # push characters into the controlling terminal's input (a classic sandbox escape)
_LOW32 = 0xFFFFFFFF


def compile_filter() -> bytes:
    """The filter as a BPF program (what ``bwrap --seccomp FD`` reads)."""
    import pyseccomp as seccomp  # needs the system's libseccomp; imported only where a sandbox starts

    assert not set(ALLOWED_SYSCALLS) & set(DENIED_SYSCALLS), "a system call both allowed and denied"
    # Rules for one call must not overlap with different actions: libseccomp lets an unconditional
    # ALLOW win over a conditional denial. So each conditional call gets complementary rules.
    filt = seccomp.SyscallFilter(defaction=seccomp.ERRNO(errno.ENOSYS))
    filt.set_attr(seccomp.Attr.CTL_OPTIMIZE, 2)  # a binary tree on the number, not ~300 comparisons
    allow, deny = seccomp.ALLOW, seccomp.ERRNO(errno.EPERM)

    def add(action: int, name: str, *args: object) -> None:
        # A call this architecture (or the system's libseccomp) does not know is skipped.
        with contextlib.suppress(OSError, RuntimeError, ValueError):
            filt.add_rule(action, name, *args)

    for name in ALLOWED_SYSCALLS:
        add(allow, name)
    for name in DENIED_SYSCALLS:
        add(deny, name)
    # clone: allowed without namespace flags, EPERM with any (flags are a full 64-bit argument).
    add(allow, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, sum(CLONE_NAMESPACE_FLAGS), 0))
    for flag in CLONE_NAMESPACE_FLAGS:
        add(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    # personality: the allowed personas, compared on all 64 bits (anything else is not allowed).
    for persona in ALLOWED_PERSONAS:
        add(allow, "personality", seccomp.Arg(0, seccomp.EQ, persona))
    # socket: the kernel reads an int, so the denied families are matched on the low 32 bits; the
    # allowed ones on all 64 (a family with high bits set is not allowed).
    for family in DENIED_SOCKET_FAMILIES:
        add(deny, "socket", seccomp.Arg(0, seccomp.MASKED_EQ, _LOW32, family))
    add(allow, "socket", seccomp.Arg(0, seccomp.LT, min(DENIED_SOCKET_FAMILIES)))
    for family in range(min(DENIED_SOCKET_FAMILIES), MAX_SOCKET_FAMILY + 1):
        if family not in DENIED_SOCKET_FAMILIES:
            add(allow, "socket", seccomp.Arg(0, seccomp.EQ, family))
    # ioctl: TIOCSTI denied on the low 32 bits (the kernel reads an unsigned int); everything else
    # allowed, written as "some bit of the low 32 differs from TIOCSTI's" (one rule per bit).
    add(deny, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, _LOW32, TIOCSTI))
    for bit in range(32):
        add(allow, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 1 << bit, ~TIOCSTI & (1 << bit)))
    # clone3: its flags are in memory; ENOSYS (the default) makes glibc fall back to clone.
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
