"""What every sandbox launch on this machine shares, and the one way to start a sandboxed command.

``SandboxHost`` keeps, in a root-only folder of its own (never inside a run folder), the compiled
seccomp program and the made-up ``/etc`` files; ``launch_argv`` writes one launch's spec next to
its logs and returns the argv that starts it through ``harnessrl.sandbox.enter``. The local runner
(harness attempts) and the command evaluator (scoring) both launch through here, so both get the
same sandbox.

**A folder outlives no process.** Each host holds an exclusive ``flock`` on ``owner.lock`` in its
folder while it lives (the kernel drops it when the process dies, ``SIGKILL`` included); the first
folder a host makes sweeps its parent folder for ``harnessrl-sandbox-*`` folders of the same user
whose lock nobody holds and removes them. A folder without a lock file is one being created (its
lock follows within microseconds) or one an older harnessrl left: it is removed once it is an hour old.
The gateway bridge's socket folders (``hrl-*``, ``proxy.py``) are owned the same way.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import shutil
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from harnessrl.errors import ConfigError
from harnessrl.sandbox.bwrap import DEFAULT_PATH, Bind, Layout, bwrap_argv, find_bwrap, write_etc
from harnessrl.sandbox.enter import status_path
from harnessrl.sandbox.rootfs import ImageRoot, image_env
from harnessrl.sandbox.seccomp import filter_file

# The launcher's (and so bwrap's) own environment. The sandboxed command gets its environment from
# the spec; the controller's environment must reach no process inside (bwrap's /proc/1/environ is
# visible there).
LAUNCHER_ENV = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"}

HOST_DIR_PREFIX = "harnessrl-sandbox-"
OWNER_LOCK = "owner.lock"  # in each host's folder: flock'ed by its process while it lives
#: Age past which a host folder without a lock file is abandoned (its lock is made right after it).
UNLOCKED_GRACE_S = 3600


def _claim_abandoned(folder: Path, unlocked_grace_s: float | None) -> int | None:
    """The locked ``owner.lock`` of ``folder`` (an owned folder of this user) when no living process
    holds it (the caller removes the folder, then closes it); ``-1`` for a folder without a lock file
    older than ``unlocked_grace_s`` (never, if None); ``None`` while its process lives (or for what is
    not ours to judge)."""
    try:
        fd = os.open(folder / OWNER_LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            if unlocked_grace_s is not None and time.time() - os.lstat(folder).st_mtime > unlocked_grace_s:
                return -1
        return None
    except OSError:
        return None  # a link or something else planted there
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # EWOULDBLOCK: its process lives
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def sweep_abandoned(
    parent: Path, prefix: str = HOST_DIR_PREFIX, unlocked_grace_s: float | None = UNLOCKED_GRACE_S
) -> list[Path]:
    """Remove the owned folders (``make_owned_dir``) under ``parent`` whose process is gone (killed
    before it could remove its own); returns them. Only this user's real folders named ``prefix*``
    are considered; one without a lock file only past ``unlocked_grace_s`` (never, if None)."""
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    me = os.geteuid()
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != me:
            continue
        fd = _claim_abandoned(Path(entry.path), unlocked_grace_s)
        if fd is None:
            continue
        try:  # the lock is held until the folder is gone: an owner still taking it sees it removed
            shutil.rmtree(entry.path, ignore_errors=True)
        finally:
            if fd >= 0:
                os.close(fd)
        removed.append(Path(entry.path))
    return removed


def private_temp_folder(stem: str, *, field: str, remedy: str) -> Path:
    """``<temp>/<stem>-<uid>``, made 0700 if missing. The temp folder is shared by every local user:
    one who made such a folder first (or a link by its name) would choose what our harnesses read
    from it (a preset's config file, the ``search`` command). So an existing one is used only if it
    is a real folder, this user's, and writable by no one else; else a ``ConfigError`` naming
    ``field`` and saying ``remedy``."""
    folder = Path(tempfile.gettempdir()) / f"{stem}-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise ConfigError(
            f"{field}: {folder} is not a private folder of this user (owner uid {info.st_uid}, mode "
            f"{stat.filemode(info.st_mode)}: a link, someone else's, or writable by others): {remedy}"
        )
    return folder


def make_owned_dir(parent: Path, prefix: str = HOST_DIR_PREFIX) -> tuple[Path, int]:
    """A new folder ``prefix*`` under ``parent`` (0700) and the descriptor of its ``owner.lock``, locked
    by this process until it is closed or the process ends: ``sweep_abandoned`` leaves it alone."""
    while True:
        folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        fd = os.open(
            folder / OWNER_LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_nlink > 0:
            return folder, fd
        # A sweeper took the lock between its creation and ours (and removed the folder): again.
        os.close(fd)


class SandboxHost:
    """``parent``: where its folder is made (default: the system's temporary folder)."""

    def __init__(self, parent: Path | None = None) -> None:
        self._parent = parent
        self._dir: Path | None = None
        self._owner_fd = -1
        self._seccomp: Path | None = None
        self._lock = threading.Lock()

    def _prepare(self) -> tuple[Path, Path]:
        with self._lock:
            if self._dir is None or not self._dir.is_dir():
                parent = self._parent or Path(tempfile.gettempdir())
                if self._dir is None:  # once per host: what killed processes left
                    sweep_abandoned(parent)
                self._release()
                # Locked until close() or this process's end (the kernel drops it then).
                self._dir, self._owner_fd = make_owned_dir(parent)
                write_etc(self._dir / "etc")
                self._seccomp = filter_file(self._dir)
            assert self._seccomp is not None
            return self._dir / "etc", self._seccomp

    def _release(self) -> None:
        if self._owner_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._owner_fd)
            self._owner_fd = -1

    def launch_argv(
        self,
        spec_path: Path,
        *,
        sandbox: str,
        command: list[str],
        cwd: Path,
        env: dict[str, str],
        writable: tuple[Path, ...] = (),
        read_only: tuple[Path, ...] = (),
        network: str = "gateway",
        gateway_port: int | None = None,
        gateway_socket: str | None = None,
        cgroup_dirs: tuple[Path, ...] = (),
        limits: dict[str, Any] | None = None,
        binds: tuple[Bind, ...] = (),
        tmp_size_mb: int | None = None,
        root: ImageRoot | None = None,
        venv_on_path: bool = True,
    ) -> list[str]:
        """Write the launch spec to ``spec_path`` (a folder the sandbox never sees) and return the argv
        that runs ``command`` in the sandbox: ``sandbox`` is ``"bwrap"`` or ``"none"`` (no isolation).
        The launcher reports whether the command started in ``enter.status_path(spec_path)``.

        With ``root`` (an image, ``sandbox`` must be ``"bwrap"``) the image is the sandbox's ``/``; the
        process starts from the image's declared environment (``rootfs.image_env``) under ``env``, and
        ``PATH`` is the image's unless ``env`` sets one. ``venv_on_path`` puts harnessrl's venv first
        on ``PATH`` (scorers run ``python -m harnessrl...``; a harness in an image does not want the
        venv's ``python`` in front of the image's)."""
        _refuse_nul(command, env, cwd, binds)
        if root is not None:
            if sandbox != "bwrap":
                raise ConfigError(
                    f"image {root.name!r}: an image root needs the bubblewrap sandbox (harness.sandbox)"
                )
            env = {**image_env(root), **env}
            env.setdefault("PATH", root.search_path())
        path = env.get("PATH") or DEFAULT_PATH
        env = {**env, "PATH": f"{Path(sys.prefix) / 'bin'}:{path}" if venv_on_path else path}
        limits = limits or {}
        spec: dict[str, Any] = {
            "cgroup_dirs": [str(d) for d in cgroup_dirs],
            "limits": limits,
            "status_file": status_path(str(spec_path)),
            # The host folders the sandbox may write (``limits.max_entries`` bounds their entries).
            "writable": [str(p) for p in (*writable, *(b.source for b in binds if b.writable))],
        }
        Path(spec["status_file"]).unlink(missing_ok=True)  # a dead controller's attempt may have left one
        if sandbox == "bwrap":
            bwrap = find_bwrap()
            if bwrap is None:
                raise ConfigError("harness.sandbox: bubblewrap (bwrap) is not installed")
            if network == "gateway" and gateway_socket and gateway_port is not None and gateway_port < 1024:
                # Inside, the relay runs as an unprivileged user, which cannot listen below 1024.
                raise ConfigError(f"gateway port {gateway_port}: the sandbox can only relay ports >= 1024")
            etc_dir, seccomp = self._prepare()
            layout = Layout(
                command=command,
                cwd=cwd,
                env=env,
                etc_dir=etc_dir,
                writable=writable,
                read_only=read_only,
                network=network,
                gateway_port=gateway_port,
                gateway_socket=gateway_socket,
                binds=binds,
                tmp_size_mb=tmp_size_mb,
                # Each private tmpfs holds at most ``memory_mb``: without a memory cgroup nothing else
                # bounds what is written there (its pages are not the processes' address space).
                tmpfs_mb=limits.get("memory_mb") or None,
                root=root,
            )
            spec.update(bwrap_argv=bwrap_argv(layout, bwrap=bwrap), seccomp_file=str(seccomp))
        else:
            spec.update(bwrap_argv=None, argv=command, cwd=str(cwd), env=env)
        spec_path.write_text(json.dumps(spec))
        spec_path.chmod(0o600)
        return [sys.executable, "-I", "-m", "harnessrl.sandbox.enter", str(spec_path)]

    def close(self) -> None:
        with self._lock:
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None
            self._release()


def _refuse_nul(command: list[str], env: dict[str, str], cwd: Path, binds: tuple[Bind, ...]) -> None:
    """A ``ConfigError`` for a NUL byte in anything that becomes a bubblewrap option or an ``exec``
    string (filled from task fields: a task file is data). bubblewrap reads its options NUL-separated
    (``--args``), so ``X=a\0--bind\0/\0/hostroot`` in the environment added a writable bind of the
    host's ``/``; every caller (harness attempts, scorers) is guarded here, whatever it checked."""
    named = [*(("the command", a) for a in command), ("the working folder", str(cwd))]
    named += [(f"the environment variable {k!r}", f"{k}={v}") for k, v in env.items()]
    named += [(f"the bind {str(b.target)!r}", f"{b.source}{b.target}") for b in binds]
    for what, text in named:
        if "\0" in text:
            raise ConfigError(f"sandbox: {what} holds a NUL byte, which no option or exec string can hold")


_SHARED: SandboxHost | None = None


def shared_host() -> SandboxHost:
    """The process-wide host (its folder is removed at exit)."""
    global _SHARED
    if _SHARED is None:
        _SHARED = SandboxHost()
        atexit.register(_SHARED.close)
    return _SHARED


def files_in_argv(argv: list[str], *, inside: Path) -> tuple[Path, ...]:
    """The executable and script a command names (its first two items) when they are files outside
    ``inside``: bound read-only so ``python agent.py`` works without exposing the script's folder."""
    found = []
    for item in argv[:2]:
        if os.path.isabs(item) and os.path.isfile(item) and not Path(item).is_relative_to(inside):
            found.append(Path(item))
    return tuple(found)
