"""The seccomp filter is at least as strict as Docker's default profile, written out as data.

Source of the comparison: moby/moby ``profiles/seccomp/default.json`` (read as vendored in moby at
``vendor/github.com/moby/profiles/seccomp/default.json``, commit b985e2313a86, 2026-08), for a
container started without added capabilities: its default action is ``SCMP_ACT_ERRNO`` (EPERM);
``DOCKER_DEFAULT_DOES_NOT_ALLOW`` is every x86_64 system call of Linux 6.18 that the profile's
unconditional allow list leaves out, or allows only with a capability (CAP_SYS_ADMIN,
CAP_SYS_NICE, CAP_SYS_PTRACE, CAP_SYS_MODULE, CAP_SYS_BOOT, ...) or only with certain arguments
(``personality``, ``socket``, ``clone``, ``clone3``).

Each entry is checked twice: against the compiled BPF program, read by a small interpreter of the
instructions libseccomp emits (exact: the verdict is the filter's, not a capability check's), and
by calling it from inside a real sandbox, with the same probe run without a sandbox as the control
(as root, where each call the kernel has reaches it: the arguments make it fail harmlessly).
"""

from __future__ import annotations

import errno
import os
import struct

import pytest

from harnessrl.controller.sandbox_check import run_probe
from harnessrl.controller.seccomp_probes import DENIED_ERRNOS, SECCOMP_PROBES, seccomp_calls, syscall_number
from harnessrl.sandbox.bwrap import sandbox_problem
from harnessrl.sandbox.seccomp import ALLOWED_SYSCALLS, DENIED_SYSCALLS, compile_filter

needs_sandbox = pytest.mark.skipif(
    os.geteuid() != 0 or sandbox_problem() is not None, reason=f"no sandbox here: {sandbox_problem()}"
)

DOCKER_DEFAULT_DOES_NOT_ALLOW = (
    # allowed by Docker only with certain arguments
    "socket(AF_ALG)",  # socket: family < 38, == 39 or > 40
    "socket(AF_VSOCK)",
    "clone(CLONE_NEWUSER)",  # clone: no namespace flag, unless CAP_SYS_ADMIN
    "clone(CLONE_NEWNET)",
    "clone3",  # ENOSYS unless CAP_SYS_ADMIN
    "personality(READ_IMPLIES_EXEC)",  # personality: 0x0, 0x8, 0x20000, 0x20008, 0xffffffff only
    "personality(ADDR_NO_RANDOMIZE)",
    # allowed by Docker only with a capability
    *("mount", "umount2", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick"),
    *("mount_setattr", "pivot_root", "unshare", "setns", "sethostname", "setdomainname", "syslog"),
    *("bpf", "perf_event_open", "fanotify_init", "lookup_dcookie", "quotactl", "quotactl_fd"),
    *("lsm_get_self_attr", "lsm_set_self_attr", "lsm_list_modules"),  # CAP_SYS_ADMIN
    *("chroot",),  # CAP_SYS_CHROOT
    *("reboot",),  # CAP_SYS_BOOT
    *("init_module", "finit_module", "delete_module"),  # CAP_SYS_MODULE
    *("acct",),  # CAP_SYS_PACCT
    *("kcmp", "pidfd_getfd", "process_madvise"),  # CAP_SYS_PTRACE
    *("iopl", "ioperm"),  # CAP_SYS_RAWIO
    *("settimeofday", "clock_settime"),  # CAP_SYS_TIME
    *("vhangup",),  # CAP_SYS_TTY_CONFIG
    *("mbind", "set_mempolicy", "get_mempolicy", "set_mempolicy_home_node"),  # CAP_SYS_NICE
    *("open_by_handle_at",),  # CAP_DAC_READ_SEARCH
    # not in the profile at all
    *("io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd", "keyctl", "add_key"),
    *("request_key", "migrate_pages", "move_pages", "kexec_load", "kexec_file_load", "swapon"),
    *("swapoff", "uselib", "ustat", "sysfs", "_sysctl", "nfsservctl", "create_module"),
    *("get_kernel_syms", "query_module", "getpmsg", "putpmsg", "afs_syscall", "tuxcall", "security"),
    *("vserver", "open_tree_attr", "file_getattr", "file_setattr"),
)
# Allowed by Docker's default, denied here (each with its reason in seccomp.py).
WE_ALSO_DENY = (
    *("ptrace", "process_vm_readv", "process_vm_writev"),  # Docker: allowed on kernels >= 4.8
    *("execveat", "name_to_handle_at", "modify_ldt", "adjtimex"),
    *("ioctl(TIOCSTI)", "ioctl(TIOCSTI, high bits set)"),
)
# What the issue found allowed before this filter: each must reach the kernel without a sandbox.
ISSUE_35 = (
    "io_uring_setup",
    "personality(READ_IMPLIES_EXEC)",
    "mbind",
    "set_mempolicy",
    "move_pages",
    "execveat",
)

# -- the compiled program, read instruction by instruction ---------------------------------------

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}[os.uname().machine]
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000


def verdict(program: bytes, number: int, args: tuple[int, ...] = ()) -> int:
    """What the classic-BPF ``program`` returns for one call (``struct seccomp_data``: nr, arch,
    instruction pointer, six 64-bit arguments). Models the instructions libseccomp emits and fails
    on any other, so a new one cannot be misread."""
    argv = [a & (2**64 - 1) for a in (*args, 0, 0, 0, 0, 0, 0)[:6]]
    data = struct.pack("<iIQ6Q", number, AUDIT_ARCH, 0, *argv)
    insns = [struct.unpack_from("<HBBI", program, i) for i in range(0, len(program), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x54:  # and #k
            acc &= k
        elif code == 0x05:  # ja +k
            pc += k
        elif code in (0x15, 0x25, 0x35, 0x45):  # jeq / jgt / jge / jset #k
            taken = {0x15: acc == k, 0x25: acc > k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        elif code == 0x06:  # ret #k
            return k
        else:
            raise AssertionError(f"BPF opcode {code:#x} is not modelled here")


def denial(answer: int) -> str | None:
    """ "EPERM"/"ENOSYS" for a filter denial, None for anything else."""
    if answer & 0xFFFF0000 == RET_ERRNO and answer & 0xFFFF in DENIED_ERRNOS:
        return errno.errorcode[answer & 0xFFFF]
    return None


def test_the_comparison_is_what_the_check_probes():
    assert not set(DOCKER_DEFAULT_DOES_NOT_ALLOW) & set(WE_ALSO_DENY)
    assert set(DOCKER_DEFAULT_DOES_NOT_ALLOW) | set(WE_ALSO_DENY) == set(SECCOMP_PROBES)
    assert len(DOCKER_DEFAULT_DOES_NOT_ALLOW) == len(set(DOCKER_DEFAULT_DOES_NOT_ALLOW))


def test_the_compiled_filter_denies_what_dockers_default_does_not_allow():
    program = compile_filter()
    calls = seccomp_calls()
    not_denied = {
        label: hex(verdict(program, number, tuple(args)))
        for label, (number, *args) in calls.items()
        if denial(verdict(program, number, tuple(args))) is None
    }
    assert not_denied == {}
    # Every entry this architecture has was checked (on x86_64: all but none).
    if os.uname().machine == "x86_64":
        assert set(calls) == set(SECCOMP_PROBES)


def test_denials_with_a_reason_answer_eperm_and_the_rest_enosys():
    program = compile_filter()
    for name in DENIED_SYSCALLS:
        number = syscall_number(name)
        if number is not None:
            assert denial(verdict(program, number)) == "EPERM", name
    for name in ("uselib", "_sysctl", "nfsservctl", "clone3", "file_getattr", "lsm_list_modules"):
        assert denial(verdict(program, syscall_number(name))) == "ENOSYS", name
    # A number no kernel has yet, e.g. a call newer than this list: ENOSYS, as an older kernel says.
    assert denial(verdict(program, 600)) == "ENOSYS"


# The control of the two tests above: what harnesses use is allowed, so "denied" is the filter's
# choice and the interpreter is not merely answering "denied" to everything.
HARNESSES_NEED = [
    ("read", (0, 0, 0)),
    ("futex", (0, 0, 0)),
    ("execve", (0, 0, 0)),
    ("clone", (0x01200011, 0, 0)),  # fork(): CLONE_CHILD_SETTID|CLONE_CHILD_CLEARTID|SIGCHLD
    ("clone", (0x003D0F00, 0, 0)),  # a thread (pthread_create)
    ("personality", (0xFFFFFFFF,)),  # a query
    ("personality", (0x0,)),
    ("socket", (1, 1, 0)),  # AF_UNIX
    ("socket", (2, 1, 0)),  # AF_INET
    ("socket", (10, 2, 0)),  # AF_INET6
    ("socket", (16, 3, 0)),  # AF_NETLINK (getifaddrs)
    ("ioctl", (0, 0x5401, 0)),  # TCGETS
    ("ioctl", (0, (1 << 32) | 0x5401, 0)),  # the kernel reads 32 bits: still TCGETS
    ("ioctl", (0, 0x5413, 0)),  # TIOCGWINSZ, one bit from TIOCSTI
    ("memfd_create", (0, 0x8)),  # MFD_NOEXEC_SEAL (Bun's spawn does this)
    ("landlock_restrict_self", (0, 0)),  # run_scored; Codex's own sandbox
    ("seccomp", (0, 0, 0)),
    ("prctl", (4, 0)),
    ("io_setup", (1, 0)),  # POSIX AIO, not io_uring
    ("statx", (0, 0, 0, 0, 0)),
    ("clock_nanosleep", (0, 0, 0, 0)),
]


@pytest.mark.parametrize(("name", "args"), HARNESSES_NEED, ids=[f"{n}{a[:2]}" for n, a in HARNESSES_NEED])
def test_what_harnesses_use_is_allowed(name, args):
    assert verdict(compile_filter(), syscall_number(name), args) == RET_ALLOW


def test_every_allowed_name_is_allowed_unconditionally():
    program = compile_filter()
    refused = [
        name
        for name in ALLOWED_SYSCALLS
        if (number := syscall_number(name)) is not None and verdict(program, number) != RET_ALLOW
    ]
    assert refused == []


# -- from inside a real sandbox, and the control without one ----------------------------------------


@needs_sandbox
def test_each_call_is_refused_inside_a_real_sandbox():
    run = run_probe(["syscalls"])
    answers = run.seen.get("syscalls", {})
    assert answers, run.stderr[-2000:]
    allowed = {label: errno.errorcode.get(a, a) for label, a in answers.items() if a not in DENIED_ERRNOS}
    assert allowed == {}
    assert set(answers) == set(seccomp_calls())


@needs_sandbox
def test_control_without_the_sandbox_the_same_calls_reach_the_kernel():
    run = run_probe(["syscalls"], sandbox="none")
    answers = run.seen.get("syscalls", {})
    assert answers, run.stderr[-2000:]
    # As root without a filter nothing is refused by permission; ENOSYS only where this kernel
    # lacks the call (removed ones, module or kexec support not built in).
    assert {label for label, a in answers.items() if a == errno.EPERM} == set()
    reached = {label for label, a in answers.items() if a != errno.ENOSYS}
    assert set(ISSUE_35) <= reached
    assert len(reached) >= 60, sorted(set(answers) - reached)
