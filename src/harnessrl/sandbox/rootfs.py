"""A container image's filesystem as a sandbox's root: ``ImageRoot`` and the bubblewrap arguments for it.

With an image root the sandbox's ``/`` is the image's filesystem instead of the host's ``/usr`` and a
few ``/etc`` files: a task's environment (its Python, its test dependencies, its tools) is the
image's. Everything else the sandbox promises stays as it is (``bwrap.py``): the same namespaces,
seccomp filter, uid, the workspace and home the only writable places, a private ``/tmp``, ``/run``,
``/dev`` and ``/proc``, the gateway relay the only way out.

How the image becomes the root (``root_args``, a pure function of the image's tree on disk):

- each top-level entry of the image is bound **read-only** (``--ro-bind``), its symlinks recreated as
  the same links; the image's ``/proc``, ``/dev``, ``/sys``, ``/tmp`` and ``/run`` are left out (the
  sandbox has its own, and no ``/sys``);
- a host path the sandbox binds on top (the workspace, the harness's install, ``/etc/passwd``...)
  needs a mount point. Where the image already has it, the bind lands on top; where it does not, the
  folder that would hold it is not bound whole but *split*: made as an empty folder, with each of
  its entries bound one by one, so the new mount point can be created beside them (bubblewrap cannot
  create anything inside a read-only bind). A symlink of the image in the way of such a path is left
  out (the host path wins);
- bubblewrap binds every path ``nosuid`` and ``nodev``: a setuid binary of the image gains nothing (and
  ``no_new_privs`` would stop it anyway), a device node in the image cannot be opened;
- special files (device nodes, FIFOs, sockets) of a split folder are left out;
- at the end the skeleton that holds it all (bubblewrap's own tmpfs ``/``) is remounted read-only
  (``--remount-ro /``), so nothing can be created beside the image's folders.

``/etc/passwd``, ``group``, ``hosts`` and ``hostname`` are always the sandbox's own (``bwrap.SANDBOX_ETC``),
never the image's; ``/etc/ld.so.preload`` is hidden (an image's preload list would load its library
into the harness, whose install may come from the host). The image's declared environment is
filtered the same way (``image_env``): its ``PATH`` and ordinary variables pass, variables that make
a loader or an interpreter load code (``LD_*``, ``PYTHON*``, ``NODE_OPTIONS``, ``BASH_ENV``...) do not.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

# The sandbox's own: never taken from the image.
SKIPPED_TOP = frozenset({"proc", "dev", "sys", "tmp", "run"})
# /etc files of the image that are hidden behind an empty file (they would load code into the harness).
HIDDEN_ETC = ("ld.so.preload",)
# Variables of an image's declared environment that never reach a sandboxed process: they make the
# loader, an interpreter or a shell run code before the program does.
_BLOCKED_ENV = re.compile(
    r"^(LD_.*|PYTHON.*|NODE_OPTIONS|NODE_PATH|BASH_ENV|ENV|PERL5OPT|PERL5LIB|RUBYOPT|RUBYLIB|"
    r"JAVA_TOOL_OPTIONS|_JAVA_OPTIONS|GCONV_PATH|HOSTALIASES|LOCALDOMAIN|RES_OPTIONS|HOME|USER|"
    r"SHELL|PWD|OLDPWD|HOSTNAME|TMPDIR|MALLOC_.*|GLIBC_TUNABLES|HARNESSRL_.*|OPENAI_.*|ANTHROPIC_.*)$"
)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class ImageRoot:
    """An image's root filesystem, read-only on the host (a ``podman image mount``), ready to be a
    sandbox's ``/``. ``env`` is the image's declared environment (``Config.Env``) as ``NAME=value``
    pairs; ``name`` and ``image_id`` are for messages and records."""

    path: Path
    name: str
    image_id: str = ""
    env: tuple[str, ...] = ()
    volumes: tuple[str, ...] = field(default=())  # declared VOLUMEs: read-only like the rest

    def declared_env(self) -> dict[str, str]:
        """The image's environment as a dict (later entries win, as in a container)."""
        out: dict[str, str] = {}
        for item in self.env:
            key, sep, value = item.partition("=")
            if sep and key:
                out[key] = value
        return out

    def search_path(self) -> str:
        """The ``PATH`` the image declares, else the standard one."""
        return self.declared_env().get("PATH") or DEFAULT_PATH

    def has(self, inside: str) -> bool:
        """Whether ``inside`` (an absolute path in the image) exists, following the image's own links
        within the image (never out of it)."""
        return resolve_inside(self.path, inside) is not None

    def which(self, name: str) -> str | None:
        """Where ``name`` is on the image's ``PATH`` (an inside path), as ``execvp`` would find it."""
        for folder in self.search_path().split(":"):
            if not folder.startswith("/"):
                continue
            candidate = f"{folder.rstrip('/')}/{name}"
            real = resolve_inside(self.path, candidate)
            if real is not None and real.is_file() and os.access(real, os.X_OK):
                return candidate
        return None


def image_env(root: ImageRoot) -> dict[str, str]:
    """The image's declared variables a sandboxed process may start with (see the module docstring)."""
    return {k: v for k, v in root.declared_env().items() if not _BLOCKED_ENV.match(k)}


def resolve_inside(rootfs: Path, inside: str, *, max_links: int = 40) -> Path | None:
    """The host path of ``inside`` within the image tree at ``rootfs``, following symlinks as the image
    would see them (absolute links are taken relative to its root); None if it does not exist."""
    parts = [p for p in PurePosixPath(inside).parts if p != "/"]
    current = PurePosixPath("/")
    links = 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            current = current.parent
            continue
        host = rootfs / str(current / part).lstrip("/")
        try:
            info = host.lstat()
        except OSError:
            return None
        if stat.S_ISLNK(info.st_mode):
            links += 1
            if links > max_links:
                return None
            target = PurePosixPath(os.readlink(host))
            if target.is_absolute():
                current = PurePosixPath("/")
            parts = [p for p in target.parts if p != "/"] + parts
            continue
        current = current / part
    return rootfs / str(current).lstrip("/")


def _kind(path: Path) -> str | None:
    try:
        mode = path.lstat().st_mode
    except OSError:
        return None
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    return "special"


def split_points(rootfs: Path, targets: Mapping[str, str]) -> tuple[set[str], set[str]]:
    """Which folders of the image must be split (made, with their entries bound one by one) so that
    every target (inside path -> ``"dir"`` or ``"file"``, what will be bound there) has a mount point;
    and which entries of the image are left out because a target's path goes through them (a
    symlink) or replaces them (an entry of another kind)."""
    split: set[str] = {"/"}
    left_out: set[str] = set()
    for target, kind in targets.items():
        parts = [p for p in PurePosixPath(target).parts if p != "/"]
        if not parts or parts[0] in SKIPPED_TOP:
            continue  # the sandbox's own /tmp, /run, /dev, /proc: nothing of the image there
        current = PurePosixPath("/")
        for i, part in enumerate(parts):
            child = current / part
            last = i == len(parts) - 1
            found = _kind(rootfs / str(child).lstrip("/"))
            if found == (kind if last else "dir"):
                current = child
                continue
            # The image has nothing usable there: its parent is made and filled entry by entry.
            if found is not None:
                left_out.add(str(child))
            node = current
            while True:
                split.add(str(node))
                if str(node) == "/":
                    break
                node = node.parent
            break
    return split, left_out


def root_args(root: ImageRoot, targets: Mapping[str, str]) -> list[str]:
    """bwrap arguments making ``root`` the sandbox's ``/`` (read-only), with a mount point for every
    target (inside path -> ``"dir"``/``"file"``). The caller binds the targets afterwards, then adds
    ``--remount-ro /``."""
    rootfs = root.path
    split, left_out = split_points(rootfs, targets)
    args: list[str] = []

    def emit(inside: PurePosixPath) -> None:
        host_dir = rootfs / str(inside).lstrip("/")
        try:
            entries = sorted(os.scandir(host_dir), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            child = inside / entry.name
            if str(inside) == "/" and entry.name in SKIPPED_TOP:
                continue
            if str(inside) == "/etc" and entry.name in HIDDEN_ETC or str(child) in left_out:
                continue
            kind = _kind(Path(entry.path))
            if kind == "link":
                args.extend(["--symlink", os.readlink(entry.path), str(child)])
            elif kind == "dir":
                if str(child) in split:
                    args.extend(["--dir", str(child)])
                    emit(child)
                else:
                    args.extend(["--ro-bind", entry.path, str(child)])
            elif kind == "file":
                args.extend(["--ro-bind", entry.path, str(child)])
            # special files (devices, FIFOs, sockets): left out

    emit(PurePosixPath("/"))
    return args


def mount_targets(
    *,
    read_only: Iterable[Path] = (),
    writable: Iterable[Path] = (),
    bind_targets: Iterable[tuple[Path, Path]] = (),
    files: Iterable[str] = (),
) -> dict[str, str]:
    """The mount points a layout needs (inside path -> ``"dir"``/``"file"``), from host paths bound at
    the same path, ``(source, target)`` binds, and inside files (``/etc/passwd``...)."""
    out: dict[str, str] = {}
    for path in (*read_only, *writable):
        if path.exists():
            out[str(path)] = "dir" if path.is_dir() else "file"
    for source, target in bind_targets:
        out[str(target)] = "dir" if source.is_dir() else "file"
    for inside in files:
        out[inside] = "file"
    return out
