"""Can this image run the harness? Checked before the run starts, never discovered by a failed rollout.

With ``harness = "host"`` the harness's install (harnessrl's venv and the Python it was made from,
``.harnesses/``, ``harness.mounts``) is mounted from this machine at the same paths, and its programs
then run on the image's C library and shared libraries. With ``harness = "image"`` the image brings
the harness. Either way the sandbox's first process, ``init.py``, runs on harnessrl's own Python.
``harness_problems`` lists what is missing:

- the image has no ``/bin/sh`` (harnesses run their tools through it);
- a program that will run (harnessrl's Python, the harness's executable, the interpreter of its
  script: ``#!/path/python``, ``#!/usr/bin/env node``) is not in the image or not on its ``PATH``;
- such a program's ELF interpreter (the dynamic loader, e.g. ``/lib64/ld-linux-x86-64.so.2``) is not in
  the image: no compatible C library (an Alpine/musl image under a glibc harness);
- a shared library it or one of Python's core extension modules needs (``libssl.so.3`` for ``ssl``,
  ``libffi.so.8`` for ``ctypes``...) is not found by the image's loader. This is asked of the loader
  itself (``ld.so --list``), run inside a real sandbox over the image, so the answer is the one the
  harness would get; the same run shows that the sandbox starts there at all.

Residual: extension modules of the harness's own packages are not listed one by one (a venv holds
thousands); one linking a library the image lacks fails when it is imported.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from harnessrl.sandbox.bwrap import SYSTEM_DIRS, python_install_paths
from harnessrl.sandbox.enter import read_status
from harnessrl.sandbox.host import LAUNCHER_ENV, SandboxHost, shared_host
from harnessrl.sandbox.rootfs import ImageRoot, resolve_inside

# Python's extension modules that link libraries outside libc and that harnesses import (TLS for the
# gateway's client, ctypes, hashes, compression). The others (sqlite3, readline, curses, uuid, tk)
# are reported only as notes.
CORE_MODULES = ("_ssl", "_hashlib", "_ctypes", "zlib", "_bz2", "_lzma")
NOTE_MODULES = ("_sqlite3", "_uuid", "readline", "_curses")
_PT_INTERP = 3


def elf_interpreter(path: str) -> str | None:
    """The dynamic loader an ELF executable names (``PT_INTERP``), ``""`` for a static one, None when
    ``path`` is not an ELF file."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or len(head) < 64:
                return None
            end = "<" if head[5] == 1 else ">"
            if head[4] == 2:
                phoff, phentsize, phnum = (
                    struct.unpack_from(end + "Q", head, 0x20)[0],
                    *struct.unpack_from(end + "HH", head, 0x36),
                )
            else:
                phoff, phentsize, phnum = (
                    struct.unpack_from(end + "I", head, 0x1C)[0],
                    *struct.unpack_from(end + "HH", head, 0x2A),
                )
            for i in range(phnum):
                f.seek(phoff + i * phentsize)
                entry = f.read(phentsize)
                if struct.unpack_from(end + "I", entry, 0)[0] != _PT_INTERP:
                    continue
                if head[4] == 2:
                    offset, size = (
                        struct.unpack_from(end + "Q", entry, 8)[0],
                        struct.unpack_from(end + "Q", entry, 32)[0],
                    )
                else:
                    offset, size = (
                        struct.unpack_from(end + "I", entry, 4)[0],
                        struct.unpack_from(end + "I", entry, 16)[0],
                    )
                f.seek(offset)
                return f.read(size).rstrip(b"\0").decode(errors="replace")
            return ""
    except OSError:
        return None


def shebang(path: str) -> list[str] | None:
    """A script's ``#!`` line split into words, or None."""
    try:
        with open(path, "rb") as f:
            line = f.readline(512)
    except OSError:
        return None
    if not line.startswith(b"#!"):
        return None
    return line[2:].decode(errors="replace").strip().split()


def _is_system(path: str) -> bool:
    return any(path == d or path.startswith(d + "/") for d in SYSTEM_DIRS)


class _Plan:
    """What to ask the image's loader: host ELF files (path -> its loader), and problems found already."""

    def __init__(self, root: ImageRoot):
        self.root = root
        self.elves: dict[str, str] = {}  # host path -> loader path inside the image
        self.problems: list[str] = []
        self.labels: dict[str, str] = {}  # host path -> what it is, for messages

    def host_program(self, path: str, label: str) -> None:
        """A program that runs from this machine's files (mounted at its own path)."""
        real = os.path.realpath(path)
        interp = elf_interpreter(real)
        if interp is None:
            words = shebang(real)
            if words:
                self.interpreter(words, f"the interpreter of {label} ({path}: #!{' '.join(words)})")
            return
        if interp and resolve_inside(self.root.path, interp) is None:
            self.problems.append(
                f"{label} ({real}) needs the loader {interp}, which the image does not have "
                "(no compatible C library: is it a glibc image?)"
            )
            return
        if interp:
            self.elves[real] = interp
            self.labels[real] = label

    def image_program(self, path: str, label: str) -> None:
        """A program the image itself must hold (an absolute path inside it)."""
        if resolve_inside(self.root.path, path) is None:
            self.problems.append(f"{label}: {path} is not in the image")

    def interpreter(self, words: list[str], label: str) -> None:
        program = words[0]
        if os.path.basename(program) == "env" and len(words) > 1:
            name = next((w for w in words[1:] if not w.startswith("-")), "")
            if name and self.root.which(name) is None:
                self.problems.append(
                    f"{label}: {name!r} is not on the image's PATH ({self.root.search_path()})"
                )
            return
        self.command(program, label)

    def command(self, program: str, label: str, *, host_harness: bool = True) -> None:
        if "/" not in program:
            if self.root.which(program) is None:
                self.problems.append(
                    f"{label}: {program!r} is not on the image's PATH ({self.root.search_path()})"
                )
        elif _is_system(program) or not host_harness:
            self.image_program(program, label)
        elif not os.path.exists(program):
            self.problems.append(f"{label}: {program} does not exist on this machine")
        else:
            self.host_program(program, label)


def _python_modules(base: Path) -> dict[str, str]:
    """The core and note extension modules of the Python install at ``base``: module -> file."""
    found: dict[str, str] = {}
    for folder in base.glob("lib/python3*/lib-dynload"):
        for entry in folder.iterdir():
            module = entry.name.split(".", 1)[0]
            if module in CORE_MODULES + NOTE_MODULES:
                found[module] = str(entry)
    return found


def harness_problems(
    root: ImageRoot,
    argv: list[str],
    *,
    host_harness: bool,
    mounts: tuple[Path, ...] = (),
    host: SandboxHost | None = None,
) -> tuple[list[str], list[str]]:
    """``(problems, notes)`` of running ``argv`` over ``root``: problems refuse the run, notes do not."""
    plan = _Plan(root)
    if resolve_inside(root.path, "/bin/sh") is None:
        plan.problems.append("no /bin/sh (harnesses run their tools through it)")
    init_python = os.path.realpath(sys.executable)
    plan.host_program(init_python, "harnessrl's Python (the sandbox's first process)")
    python_bases = {Path(sys.base_prefix)}
    if argv:
        plan.command(argv[0], f"the harness command {argv[0]!r}", host_harness=host_harness)
    modules: dict[str, str] = {}
    for base in python_bases:
        modules.update(_python_modules(base))
    if init_python in plan.elves:
        for module, path in modules.items():
            plan.elves[path] = plan.elves[init_python]
            plan.labels[path] = f"Python's {module} module"
    if plan.elves:
        _ask_the_loader(plan, mounts, host or shared_host())
    notes = [p for p in plan.problems if any(f"Python's {m} " in p for m in NOTE_MODULES)]
    problems = [p for p in plan.problems if p not in notes]
    return problems, notes


def _ask_the_loader(plan: _Plan, mounts: tuple[Path, ...], host: SandboxHost) -> None:
    """Run ``ld.so --list`` on every planned file inside a sandbox over the image."""
    script = 'for f in "$@"; do printf "== %s\\n" "$f"; "${f%%|*}" --list "${f#*|}" 2>&1; done'
    pairs = [f"{loader}|{path}" for path, loader in sorted(plan.elves.items())]
    with tempfile.TemporaryDirectory(prefix="harnessrl-imagecheck-") as tmp:
        folder = Path(tmp)
        spec = folder / "probe.json"
        (folder / "workspace").mkdir()
        readable = {Path(p) for p in plan.elves if not _is_system(p)}
        argv = host.launch_argv(
            spec,
            sandbox="bwrap",
            command=["/bin/sh", "-c", script, "sh", *pairs],
            cwd=folder / "workspace",
            env={"HOME": str(folder / "workspace"), "LANG": "C.UTF-8"},
            writable=(folder / "workspace",),
            read_only=(*python_install_paths(), *mounts, *sorted(readable)),
            network="none",
            root=plan.root,
            venv_on_path=False,
        )
        try:
            done = subprocess.run(argv, env=LAUNCHER_ENV, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            plan.problems.append("the sandbox over the image did not answer within 120 s")
            return
        status = read_status(str(spec))
    if not status.get("started"):
        detail = status.get("detail") or ""
        plan.problems.append(
            f"a sandbox over the image cannot start ({detail}): {done.stderr.strip()[-600:]}".rstrip(": ")
        )
        return
    current = None
    missing: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("== "):
            current = line[3:].split("|", 1)[-1]
            continue
        if not current:
            continue
        if "=> not found" in line:  # not in the loader's cache or paths
            missing.setdefault(current, []).append(line.split("=>")[0].strip())
        elif "error while loading shared libraries:" in line:  # in its cache, but the file is gone
            library = line.split("error while loading shared libraries:", 1)[1].split(":", 1)[0].strip()
            missing.setdefault(current, []).append(library)
    for path, libraries in missing.items():
        plan.problems.append(
            f"{plan.labels.get(path, path)} ({path}) needs {', '.join(sorted(set(libraries)))}, "
            "which the image does not have"
        )
