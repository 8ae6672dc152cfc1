"""What every sandbox launch on this machine shares, and the one way to start a sandboxed command.

``SandboxHost`` keeps, in a root-only folder of its own (never inside a run folder), the compiled
seccomp program and the made-up ``/etc`` files; ``launch_argv`` writes one launch's spec next to
its logs and returns the argv that starts it through ``harnessrl.sandbox.enter``. The local runner
(harness attempts) and the command evaluator (scoring) both launch through here, so both get the
same sandbox.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile
import threading
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


class SandboxHost:
    def __init__(self) -> None:
        self._dir: Path | None = None
        self._seccomp: Path | None = None
        self._lock = threading.Lock()

    def _prepare(self) -> tuple[Path, Path]:
        with self._lock:
            if self._dir is None or not self._dir.is_dir():
                self._dir = Path(tempfile.mkdtemp(prefix="harnessrl-sandbox-"))  # mode 0700
                write_etc(self._dir / "etc")
                self._seccomp = filter_file(self._dir)
            assert self._seccomp is not None
            return self._dir / "etc", self._seccomp

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
        if root is not None:
            if sandbox != "bwrap":
                raise ConfigError(
                    f"image {root.name!r}: an image root needs the bubblewrap sandbox (harness.sandbox)"
                )
            env = {**image_env(root), **env}
            env.setdefault("PATH", root.search_path())
        path = env.get("PATH") or DEFAULT_PATH
        env = {**env, "PATH": f"{Path(sys.prefix) / 'bin'}:{path}" if venv_on_path else path}
        spec: dict[str, Any] = {
            "cgroup_dirs": [str(d) for d in cgroup_dirs],
            "limits": limits or {},
            "status_file": status_path(str(spec_path)),
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
