"""The container tool, podman, behind one small class: build, import, inspect, mount, list, remove.

harnessrl builds and stores images with podman (Debian ``podman``) rather than code of its own. It
never touches the machine's podman setup (``/etc/containers``, ``/var/lib/containers``): every call
runs with a **private configuration** kept beside its own storage:

- ``containers.conf``: the ``runc`` runtime (``crun`` fails on hybrid cgroup layouts such as these
  machines'), the ``cgroupfs`` manager, pinned ulimits (``nofile=20000:20000``,
  ``nproc=32768:32768``: the host's may be unlimited, which runc refuses), a file events log;
- ``storage.conf``: the overlay driver, images under ``<store>/storage``, run state under
  ``/run/harnessrl-containers/<hash>`` (a tmpfs: a reboot forgets the mounts with the kernel);
- ``registries.conf``: no unqualified search registries (a bare ``FROM debian`` never goes looking).

A short name is qualified with Docker's rule before podman sees it (``qualify``: ``foo:1`` is
``docker.io/library/foo:1``, ``someone/foo`` is ``docker.io/someone/foo``), so that a pull of a
SWE-smith ``image_name`` works and a local lookup of ``foo:1`` never matches ``quay.io/x/foo:1``
(podman matches a short name against every registry's images).

A command that runs past its timeout, or is interrupted (Ctrl-C), is killed with everything it
started (``podman build`` runs ``RUN`` steps in processes of their own session, which outlive the
client), and a build's leftover working container is removed (``kill_tree`` says which overlay
layers the killed steps ran on).
A command a worker thread waits on is killed the same way once the interpreter exits (its main
thread ended: Ctrl-C under ``asyncio.to_thread``). Every command is marked with the process that
started it and the store (``processes.tool_env``): what a process killed outright (SIGKILL, OOM)
left running, and its scratch under ``<store>/tmp``, is reaped by the store's next build or prune
(``reap_orphans``).

Errors are ``ImageError`` (a ``ConfigError``: the run refuses to start) carrying the tail of the
tool's output.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harnessrl.environments.processes import (
    communicate,
    kill_tree,
    owner,
    owner_gone,
    reap_orphans,
    remove_scratch,
    stale_scratch,
    tool_env,
)
from harnessrl.errors import ConfigError

ULIMITS = ("nofile=20000:20000", "nproc=32768:32768")
RUNTIME = "runc"
#: A build argument no recipe declares, ``<owner>.<random>``: buildah keeps it with each working
#: container of the build (``buildah.json``), which so names the build that made it. Unconsumed, it
#: changes neither the layer cache nor the image (podman's log warns that it was not consumed).
BUILD_MARK = "HARNESSRL_BUILD"


class ImageError(ConfigError):
    """An image could not be found, built, pulled or mounted; the message says which and why."""


class PodmanTimeout(ImageError):
    """A podman command ran past its timeout and was killed with its processes. ``layers``: the
    overlay layers (``<graphroot>/overlay/<layer>``) the killed processes had as their root: a
    build's working containers, which nothing else removes."""

    def __init__(self, message: str, layers: frozenset[str] = frozenset()):
        super().__init__(message)
        self.layers = layers


_IMAGE_ID = re.compile(r"^(?:sha256:)?[0-9a-f]{64}$")


def qualify(reference: str) -> str:
    """``reference`` with its registry spelled out, by Docker's rule: a first component with a dot
    or a colon, or ``localhost``, is a registry; otherwise the image is on ``docker.io`` (a single
    name under ``library/``). An image id is left as it is."""
    if _IMAGE_ID.match(reference):
        return reference
    first, slash, _ = reference.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return reference
    return f"docker.io/{reference}" if slash else f"docker.io/library/{reference}"


def _toml_str(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's): a store path with a quote or a backslash
    stays one value."""
    return json.dumps(value, ensure_ascii=False)


def _toml_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(_toml_str(i) for i in items) + "]"


def podman_problem() -> str | None:
    """Why podman cannot work here (not installed, no runc), or None."""
    if shutil.which(os.environ.get("HARNESSRL_PODMAN", "podman")) is None:
        return "podman is not installed (Debian: apt-get install podman runc; ./install.sh does it)"
    if shutil.which(RUNTIME) is None:
        return "runc is not installed (Debian: apt-get install runc); podman's default crun fails on this cgroup layout"
    return None


class Podman:
    """podman with storage and configuration of its own under ``store``."""

    def __init__(self, store: Path):
        self.store = Path(store).resolve()
        self.graphroot = self.store / "storage"
        key = hashlib.sha256(str(self.store).encode()).hexdigest()[:12]
        self.runroot = Path("/run/harnessrl-containers") / key
        self.conf = self.store / "conf"
        self.binary = os.environ.get("HARNESSRL_PODMAN", "podman")

    # -- configuration --------------------------------------------------------------------------------
    def _write_conf(self) -> None:
        files = {
            "containers.conf": (
                "[containers]\n"
                f"default_ulimits = {_toml_list(ULIMITS)}\n"
                "[engine]\n"
                f'runtime = "{RUNTIME}"\n'
                'cgroup_manager = "cgroupfs"\n'
                'events_logger = "file"\n'
                f"tmp_dir = {_toml_str(str(self.runroot / 'libpod'))}\n"
            ),
            "storage.conf": (
                '[storage]\ndriver = "overlay"\n'
                f"graphroot = {_toml_str(str(self.graphroot))}\nrunroot = {_toml_str(str(self.runroot))}\n"
            ),
            "registries.conf": "unqualified-search-registries = []\n",
        }
        try:
            self.conf.mkdir(parents=True, exist_ok=True)
            for name, content in files.items():
                path = self.conf / name
                if not path.is_file() or path.read_text() != content:
                    # A temporary file of its own per writer: threads of one process write at once.
                    fd, tmp = tempfile.mkstemp(dir=self.conf, prefix=f".{name}.", suffix=".tmp")
                    with os.fdopen(fd, "w") as out:
                        out.write(content)
                    os.replace(tmp, path)
        except OSError as exc:
            raise ImageError(f"image store {str(self.store)!r}: cannot set it up: {exc}") from exc

    def env(self) -> dict[str, str]:
        """The environment every podman call runs with (the private configuration, nothing else of ours)."""
        self._write_conf()
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONTAINERS_")}
        env.update(
            CONTAINERS_CONF=str(self.conf / "containers.conf"),
            CONTAINERS_STORAGE_CONF=str(self.conf / "storage.conf"),
            CONTAINERS_REGISTRIES_CONF=str(self.conf / "registries.conf"),
        )
        return env

    # -- calls ----------------------------------------------------------------------------------------
    def run(
        self,
        *args: str,
        timeout: float = 300,
        check: bool = True,
        stdout: Any = subprocess.PIPE,
        stdin: Any = subprocess.DEVNULL,
        what: str = "",
        env: Mapping[str, str] | None = None,
        on_kill: Callable[[frozenset[str]], None] | None = None,
        stop_on_exit: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """One podman command. In a session of its own, so that a timeout kills all it started.
        ``on_kill`` is called with the overlay layers the killed processes ran on, when a timeout or
        an interruption (Ctrl-C) killed the command. ``stop_on_exit``: killed when the interpreter
        exits while a worker thread waits on it (``processes.communicate``)."""
        try:
            process = subprocess.Popen(
                [self.binary, *args],
                # Marked with this process and store: if this process is killed outright, the next
                # build or prune of the store kills what it left (``reap_orphans``).
                env={**self.env(), **tool_env(self.store), **(env or {})},
                stdin=stdin,
                stdout=stdout,
                stderr=subprocess.PIPE if stdout is subprocess.PIPE else subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise ImageError(podman_problem() or f"cannot run {self.binary}: {exc}") from exc
        try:
            out, err = communicate(process, timeout, stop_on_exit=stop_on_exit)
        except subprocess.TimeoutExpired as exc:
            layers = kill_tree(process)
            process.communicate()
            if on_kill is not None:
                on_kill(layers)
            raise PodmanTimeout(
                f"{what or 'podman ' + args[0]}: no answer after {timeout:g} s", layers
            ) from exc
        except BaseException:
            # Interrupted (Ctrl-C), or the interpreter exits while a worker thread waits on it
            # (``processes.Exiting``): nothing of it keeps running.
            layers = kill_tree(process)
            if on_kill is not None:
                on_kill(layers)
            raise
        done = subprocess.CompletedProcess(process.args, process.returncode, out, err)
        if check and done.returncode != 0:
            tail = ((done.stderr or "") + (done.stdout or ""))[-2000:].strip()
            raise ImageError(f"{what or 'podman ' + ' '.join(args[:2])} failed ({done.returncode}): {tail}")
        return done

    def exists(self, ref: str) -> bool:
        """Whether the image is here. podman's other answers (a store it cannot read) are errors, not
        "not here": that would send a recipe to be built and an image to be pulled."""
        done = self.run("image", "exists", qualify(ref), check=False)
        if done.returncode not in (0, 1):
            tail = ((done.stderr or "") + (done.stdout or ""))[-2000:].strip()
            raise ImageError(f"podman image exists {ref} failed ({done.returncode}): {tail}")
        return done.returncode == 0

    def inspect(self, ref: str) -> dict[str, Any]:
        """``podman image inspect`` of one image (its ``Id``, ``Config``, ``Labels``, ``Size``...)."""
        out = self.run("image", "inspect", "--format", "json", qualify(ref), what=f"image {ref!r}").stdout
        data = json.loads(out)
        return data[0] if isinstance(data, list) else data

    def images(self, label: str | None = None, *, all_: bool = False) -> list[dict[str, Any]]:
        args = ["images", "--format", "json", "--no-trunc", *(["--all"] if all_ else [])]
        if label:
            args += ["--filter", f"label={label}"]
        return json.loads(self.run(*args).stdout or "[]")

    def build(
        self,
        containerfile: Path,
        context: Path,
        *,
        tags: Sequence[str],
        labels: Mapping[str, str],
        build_args: Mapping[str, str],
        ca_bundle: str | None,
        log: Path,
        timeout: float,
        pull: bool,
    ) -> None:
        """``podman build``; its whole output goes to ``log``. Builds use the host's network (RUN steps
        fetch packages; no firewall chains are added) and get ``ca_bundle`` at its own path in RUN steps
        only, where package downloads go through a TLS-intercepting proxy."""
        args = ["build", "--network=host", "--layers", f"--pull={'missing' if pull else 'never'}"]
        args += ["-f", str(containerfile)]
        for tag in tags:
            args += ["-t", tag]
        for key, value in sorted(labels.items()):
            args += ["--label", f"{key}={value}"]
        for key, value in sorted(build_args.items()):
            args += ["--build-arg", f"{key}={value}"]
        if ca_bundle and os.path.isfile(ca_bundle):
            args += ["-v", f"{ca_bundle}:{ca_bundle}:ro"]
        mark = f"{owner()}.{secrets.token_hex(6)}"
        args += ["--build-arg", f"{BUILD_MARK}={mark}"]
        args.append(str(context))
        log.parent.mkdir(parents=True, exist_ok=True)
        (self.store / "tmp").mkdir(parents=True, exist_ok=True)
        # The build's scratch (the RUN steps' bundles) in a folder of its own, removed afterwards:
        # a killed build leaves its bundles behind.
        with (
            tempfile.TemporaryDirectory(
                dir=self.store / "tmp", prefix=f"build-{owner()}-", ignore_cleanup_errors=True
            ) as scratch,
            log.open("w") as out,
        ):
            # Killed (past its timeout, Ctrl-C, a stop): its working containers go too, those its RUN
            # steps ran in and those with no step running (killed in FROM, COPY or ADD: no process
            # then said which layer, and the container stayed, mounted).
            done = self.run(
                *args,
                timeout=timeout,
                check=False,
                stdout=out,
                what="podman build",
                env={"TMPDIR": scratch},
                on_kill=lambda layers: self.remove_build_containers(layers, mark),
            )
        if done.returncode != 0:
            # Killed from outside (the OOM killer, ``kill_own_builds``): nothing above removed them.
            self.remove_build_containers(frozenset(), mark)
            raise ImageError(f"podman build exited {done.returncode}:\n{log_tail(log)}")

    def reap_orphans(self) -> None:
        """What processes killed outright (SIGKILL, OOM) left of their work on this store: their
        commands still running (a ``podman build`` with its ``RUN`` steps, ``mmdebstrap`` with its
        ``apt``) killed with all they started, the working containers those steps ran in removed, and
        their scratch folders under ``<store>/tmp`` removed. Processes that live are left alone."""
        layers = reap_orphans(self.store)
        if layers:
            self.remove_containers_on(layers)
        self._remove_orphan_builds()
        for scratch in stale_scratch(self.store / "tmp"):
            remove_scratch(scratch)

    def _build_marks(self) -> dict[str, str]:
        """Container id -> ``BUILD_MARK`` of each build working container here (from its
        ``buildah.json``; none for a container of another kind or a podman that keeps no arguments)."""
        listed = self.run("ps", "--all", "--external", "--format", "json", check=False, stop_on_exit=False)
        marks: dict[str, str] = {}
        for container in json.loads(listed.stdout or "[]"):
            state = (
                self.graphroot / "overlay-containers" / container.get("Id", "") / "userdata" / "buildah.json"
            )
            try:
                mark = (json.loads(state.read_text()).get("Args") or {}).get(BUILD_MARK)
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(mark, str):
                marks[container["Id"]] = mark
        return marks

    def _remove_orphan_builds(self) -> None:
        """Remove the working containers of builds whose process is gone (``BUILD_MARK``'s owner):
        killed together with its ``podman build`` (SIGKILL of a whole cgroup, the OOM killer), no
        process is left for ``reap_orphans`` to name their layers by, and each stayed, mounted. A
        build of another PID namespace is never judged gone (``owner_gone``)."""
        for container, mark in self._build_marks().items():
            if owner_gone(mark.rpartition(".")[0]):
                self.run("rm", "--force", container, check=False, stop_on_exit=False)

    def remove_build_containers(self, layers: frozenset[str], mark: str) -> None:
        """Remove the working containers of the build marked ``mark`` and those on ``layers``."""
        for container, found in self._build_marks().items():
            if found == mark:
                self.run("rm", "--force", container, check=False, stop_on_exit=False)
        self.remove_containers_on(layers)

    def remove_containers_on(self, layers: frozenset[str]) -> None:
        """Remove the (build) containers whose root is one of these overlay layers."""
        if not layers:
            return
        # Run to the end even while the interpreter exits: this is the clean-up of a killed build.
        listed = self.run("mount", "--format", "json", check=False, stop_on_exit=False).stdout
        for container in json.loads(listed or "[]"):
            if Path(container.get("mountpoint", "")).parent.name in layers:
                self.run("rm", "--force", container["id"], check=False, stop_on_exit=False)

    def import_tar(self, tar: Path, ref: str, *, labels: Mapping[str, str], timeout: float = 600) -> None:
        changes: list[str] = []
        for key, value in sorted(labels.items()):
            changes += ["--change", f"LABEL {key}={value}"]
        changes += ["--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
        self.run("import", *changes, str(tar), ref, timeout=timeout, what=f"podman import {ref}")

    def pull(self, ref: str, timeout: float = 1800) -> None:
        self.run("pull", qualify(ref), timeout=timeout, what=f"podman pull {ref}")

    def tag(self, ref: str, *tags: str) -> None:
        self.run("tag", ref, *tags)

    def mounted_images(self) -> set[str]:
        """Ids of the images mounted now (by any process: podman keeps the count in its storage)."""
        out = self.run("image", "mount", "--format", "json", check=False).stdout
        return {image.get("id", "") for image in json.loads(out or "[]")} - {""}

    def mount(self, ref: str) -> Path:
        """The image's root filesystem, mounted read-only on this machine (podman keeps a count)."""
        path = self.run("image", "mount", ref, what=f"podman image mount {ref}").stdout.strip()
        if not path or not Path(path).is_dir():
            raise ImageError(f"podman image mount {ref}: no folder ({path!r})")
        return Path(path)

    def unmount(self, ref: str, *, force: bool = True) -> None:
        """``force``: unmounted whoever mounted it; else this process's mount is given back (podman
        unmounts when no one else holds it)."""
        self.run("image", "unmount", *(["--force"] if force else []), ref, check=False)

    def remove(self, ref: str) -> bool:
        self.unmount(ref)
        return self.run("rmi", "--force", ref, check=False).returncode == 0

    def prune_dangling(self) -> None:
        self.run("image", "prune", "--force", check=False, timeout=600)


def log_tail(log: Path, lines: int = 25) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])
