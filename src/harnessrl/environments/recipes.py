"""Build recipes: what a recipe reads (checked before it is built) and the digest its image is cached by.

A recipe is a Containerfile (Dockerfile syntax) and its context folder. ``check_recipe`` refuses,
before anything is built, a recipe that would read outside its context: a ``COPY``/``ADD`` source
or a ``RUN --mount`` source that is absolute or climbs out with ``..``, and a symlink in the context
that leads out of it. ``recipe_digest`` hashes everything the build reads (the Containerfile, every
file and folder of the context with its mode and link targets, empty folders too, the build
arguments, and the ids of the images it reads: those it starts ``FROM`` and those it copies from,
``COPY --from=<image>`` and ``RUN --mount=from=<image>``), so an image is rebuilt exactly when one
of them changed.

``FROM ${NAME}`` takes the value of an ``ARG NAME[=default]`` declared before the first ``FROM``
(a ``build_args`` entry wins over the default), as podman does; a variable with no value is
refused. ``pin_images`` writes the Containerfile that is built: each image it reads replaced by
the image id its digest recorded, so that a tag moved meanwhile (another controller re-tagging
``:latest``) cannot put a base into an image other than the one its digest names.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from harnessrl.environments.podman import ImageError

_INSTRUCTION = re.compile(r"^\s*([A-Za-z]+)\s+(.*)$", re.S)
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::([-+])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
_COPY_FROM = re.compile(r"(--from=)([^\s\]\"',]+)")
_MOUNT_FROM = re.compile(r"(--mount=\S*?\bfrom=)([^\s,]+)")
_KEYWORD = re.compile(r"^\s*[A-Za-z]+")
_DIRECTIVE = re.compile(r"^#\s*([A-Za-z]+)\s*=\s*(\S+)\s*$")
# A file name is bytes: one that is not UTF-8 (``caf\xe9.txt``) is hashed as its own bytes (strict
# UTF-8 raised UnicodeEncodeError, a traceback out of images build); UTF-8 names hash as before.
_NAME_BYTES = "surrogateescape"


def _lines(containerfile: Path) -> list[str]:
    """The Containerfile's lines, without the byte order mark an editor may put first: podman reads
    past it, and with it the first ``FROM`` was no instruction here (its base missing from the
    digest and never pinned: a rebuilt base left the image stale)."""
    return containerfile.read_text(errors="replace").removeprefix("\ufeff").splitlines()


def _escape_character(lines: list[str]) -> str:
    """The line-continuation character: ``\\`` unless a ``# escape=`` parser directive, among the
    directives heading the file, names another (```` ` ````), as podman's parser reads it."""
    for line in lines:
        match = _DIRECTIVE.match(line)
        if match is None:
            break
        if match.group(1).lower() == "escape" and match.group(2) in ("\\", "`"):
            return match.group(2)
    return "\\"


@dataclass(frozen=True)
class _Instruction:
    start: int  # first and last line number (1-based) of the instruction, continuations included
    end: int
    name: str  # upper case
    args: str


def _parse(lines: list[str]) -> list[_Instruction]:
    """The instructions as podman's (BuildKit's) parser reads them: a line ending with the escape
    character continues on the next; comment lines and blank lines inside a continuation are skipped
    (the instruction goes on past them); continued parts are joined as they are."""
    escape = _escape_character(lines)
    out: list[_Instruction] = []
    pending: str | None = None
    start = 0
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if pending is None:
            if not stripped or stripped.startswith("#"):
                continue
            start, pending, line = number, "", line.lstrip()
        elif not stripped or stripped.startswith("#"):
            continue  # inside a continuation: skipped, the instruction goes on
        body = line.rstrip()
        if body.endswith(escape):
            pending += body[: -len(escape)]
            continue
        match = _INSTRUCTION.match(pending + line)
        if match:
            out.append(_Instruction(start, number, match.group(1).upper(), match.group(2).strip()))
        pending = None
    if pending:  # a continuation at the end of the file ends there
        match = _INSTRUCTION.match(pending)
        if match:
            out.append(_Instruction(start, len(lines), match.group(1).upper(), match.group(2).strip()))
    return out


def instructions(containerfile: Path) -> list[tuple[int, str, str]]:
    """``(line number, INSTRUCTION, arguments)`` for each instruction; continuation lines joined,
    comments and parser directives left out."""
    return [(i.start, i.name, i.args) for i in _parse(_lines(containerfile))]


def _escapes(source: str) -> bool:
    if source.startswith(("http://", "https://", "git@")):
        return False  # a download, not a path (ADD url): it reads nothing of the host
    path = PurePosixPath(source)
    if path.is_absolute():
        return False  # COPY /x is relative to the context root in Docker and buildah
    depth = 0
    for part in path.parts:
        depth += -1 if part == ".." else 0 if part == "." else 1
        if depth < 0:
            return True
    return False


def _words(args: str, what: str) -> list[str]:
    """An instruction's arguments split as a shell would, quotes removed; an unclosed quote is an
    ``ImageError`` naming ``what`` (the instruction and its line), not a traceback."""
    try:
        return shlex.split(args, posix=True)
    except ValueError as exc:  # shlex's "No closing quotation", "No escaped character"
        raise ImageError(f"{what}: {exc.args[0] if exc.args else exc}: {args!r}") from None


def _copy_sources(args: str, what: str) -> list[str]:
    if args.startswith("["):
        try:
            items = json.loads(args)
        except ValueError:
            items = []
    else:
        items = _words(args, what)
    items = [i for i in items if isinstance(i, str)]
    if any(i.startswith("--from") for i in items):
        return []  # from another stage or image: not the context
    sources = [i for i in items if not i.startswith("--")]
    return sources[:-1]


def _global_args(containerfile: Path, build_args: Mapping[str, str]) -> dict[str, str | None]:
    """The ``ARG``s declared before the first ``FROM`` (the only ones ``FROM`` may use), each with its
    value: the build argument, else the default, else None. A default may use the ``ARG``s before it
    (``ARG BASE=${REGISTRY}/debian``), as podman expands it; one using a variable with no value has
    none itself (a ``FROM`` using it is refused naming it)."""
    values: dict[str, str | None] = {}
    for number, name, args in instructions(containerfile):
        if name == "FROM":
            break
        if name != "ARG":
            continue
        for word in _words(args, f"ARG on line {number}"):
            key, has_default, default = word.partition("=")
            if key in build_args:
                values[key] = build_args[key]
            elif has_default:
                try:
                    values[key] = _expand(default, values, f"ARG on line {number}")
                except ImageError:
                    values[key] = None
            else:
                values[key] = None
    return values


def _expand(text: str, values: Mapping[str, str | None], where: str) -> str:
    def value(match: re.Match[str]) -> str:
        key = match.group(1) or match.group(4)
        current = values.get(key)
        if match.group(2) == "-":
            return current if current else match.group(3)
        if match.group(2) == "+":
            return match.group(3) if current else ""
        if current is None:
            raise ImageError(
                f"{where} uses ${key}, which has no value: declare ARG {key}=<default> before the first "
                "FROM, or set it in build_args"
            )
        return current

    return _VARIABLE.sub(value, text)


def _from_image(args: str, values: Mapping[str, str | None], number: int) -> tuple[str, str | None]:
    """A ``FROM`` line's image (variables expanded) and the stage name it defines, if any."""
    words = [w for w in args.split() if not w.startswith("--")]
    if not words:
        return "", None
    image = _expand(words[0], values, f"FROM on line {number}")
    stage = words[2].lower() if len(words) >= 3 and words[1].lower() == "as" else None
    return image, stage


def _image_references(
    parsed: list[_Instruction], values: Mapping[str, str | None]
) -> list[tuple[_Instruction, str | None, frozenset[str]]]:
    """Each instruction with the image its ``FROM`` reads (None: a stage, ``scratch``, or no
    ``FROM``) and the stage names defined before it, as podman tracks them: a ``FROM x`` or
    ``--from=x`` after a stage named ``x`` reads that stage, not the image ``x``."""
    stages: frozenset[str] = frozenset()
    out: list[tuple[_Instruction, str | None, frozenset[str]]] = []
    for ins in parsed:
        image = None
        if ins.name == "FROM":
            found, stage = _from_image(ins.args, values, ins.start)
            if found and found.lower() not in stages and not found.isdigit() and found != "scratch":
                image = found
            out.append((ins, image, stages))
            stages = stages | {stage} if stage else stages
        else:
            out.append((ins, None, stages))
    return out


def _copied_images(ins: _Instruction, stages: frozenset[str]) -> list[str]:
    """The images a ``COPY``/``ADD --from`` or ``RUN --mount from=`` reads (not stages, not indexes)."""
    pattern = {"COPY": _COPY_FROM, "ADD": _COPY_FROM, "RUN": _MOUNT_FROM}.get(ins.name)
    if pattern is None:
        return []
    found = [m.group(2) for m in pattern.finditer(ins.args)]
    return [image for image in found if image.lower() not in stages and not image.isdigit()]


def base_images(containerfile: Path, build_args: Mapping[str, str] | None = None) -> list[str]:
    """The images a recipe reads, each once: ``FROM`` of each stage, ``COPY --from=<image>`` and
    ``RUN --mount=...,from=<image>`` (stage names and indexes, and ``scratch``, left out)."""
    values = _global_args(containerfile, build_args or {})
    parsed = _parse(_lines(containerfile))
    images: list[str] = []
    for ins, image, stages in _image_references(parsed, values):
        read = [image] if image else _copied_images(ins, stages)
        images += [i for i in read if i != "scratch" and i not in images]
    return images


def _pinned(
    ins: _Instruction, image: str | None, stages: frozenset[str], image_ids: Mapping[str, str]
) -> str:
    """The instruction's arguments with the images it reads replaced by their ids."""
    if ins.name == "FROM":
        if image is None or image not in image_ids:
            return ins.args
        words = ins.args.split()
        at = next(i for i, w in enumerate(words) if not w.startswith("--"))
        words[at] = image_ids[image]
        return " ".join(words)
    pattern = {"COPY": _COPY_FROM, "ADD": _COPY_FROM, "RUN": _MOUNT_FROM}.get(ins.name)
    if pattern is None:
        return ins.args

    def pin(match: re.Match[str]) -> str:
        name = match.group(2)
        own_stage = name.lower() in stages or name.isdigit()
        return match.group(1) + (name if own_stage else image_ids.get(name, name))

    return pattern.sub(pin, ins.args)


def pin_images(containerfile: Path, image_ids: Mapping[str, str], build_args: Mapping[str, str]) -> str:
    """The Containerfile's text with each image of ``image_ids`` (as ``base_images`` names it) that a
    ``FROM``, ``COPY --from`` or ``RUN --mount from=`` reads replaced by its id. An instruction that
    changes is written whole on its first line and its other lines (continuations, comments within)
    left blank, so that line numbers in build errors still match; stages keep their names (a stage
    named like an image is not that image)."""
    lines = _lines(containerfile)
    values = _global_args(containerfile, build_args)
    parsed = _parse(lines)
    for ins, image, stages in _image_references(parsed, values):
        args = _pinned(ins, image, stages, image_ids)
        if args == ins.args:
            continue
        keyword = _KEYWORD.match(lines[ins.start - 1])
        assert keyword is not None  # invariant: an instruction's first line starts with its keyword
        lines[ins.start - 1] = f"{keyword.group(0)} {args}"
        for number in range(ins.start + 1, ins.end + 1):
            lines[number - 1] = ""
    return "\n".join(lines) + "\n"


def check_recipe(containerfile: Path, context: Path, *, where: str) -> None:
    """Refuse a recipe that reads outside its context folder (``ImageError`` naming the line)."""
    if not containerfile.is_file():
        raise ImageError(f"{where}: the Containerfile {str(containerfile)!r} does not exist")
    if not context.is_dir():
        raise ImageError(f"{where}: the build context {str(context)!r} is not a folder")
    for number, name, args in instructions(containerfile):
        bad: list[str] = []
        if name in ("COPY", "ADD"):
            what = f"{where}: {containerfile.name}:{number}: {name}"
            bad = [s for s in _copy_sources(args, what) if _escapes(s)]
        elif name == "RUN":
            for mount in re.findall(r"--mount=(\S+)", args):
                fields = dict(f.partition("=")[::2] for f in mount.split(","))
                source = fields.get("source") or fields.get("src")
                if "from" not in fields and source and (_escapes(source) or source.startswith("/")):
                    bad.append(source)
        if bad:
            raise ImageError(
                f"{where}: {containerfile.name}:{number}: {name} reads {bad[0]!r}, outside its context "
                f"folder {str(context)!r}; put what the build needs inside the context"
            )
    real_context = Path(os.path.realpath(context))
    for folder, dirs, files in os.walk(context):
        for name in dirs + files:
            path = Path(folder) / name
            if path.is_symlink():
                target = Path(os.path.realpath(path))
                if not (target == real_context or target.is_relative_to(real_context)):
                    raise ImageError(
                        f"{where}: {path} in the build context is a link to {str(target)!r}, outside the "
                        "context; copy the file in instead"
                    )


def _field(h: hashlib._Hash, kind: bytes, data: bytes) -> None:
    """One field of the digest: its kind, its length, its bytes. Without the length a file's content
    could spell the next entry's header (a file ``a`` read as ``a`` and a second file ``b``): two
    recipes with one digest, the image cached for one used for the other."""
    h.update(kind + len(data).to_bytes(8, "big") + data)


def _file_sha256(path: Path) -> bytes:
    content = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            content.update(chunk)
    return content.digest()


def recipe_digest(
    containerfile: Path, context: Path, build_args: Mapping[str, str], base_ids: Mapping[str, str]
) -> str:
    """sha256 over what the build reads (see the module docstring), hex. Folders count too, empty
    ones included (``COPY . /app`` makes them, with their modes). Each field is kind- and
    length-prefixed (``_field``), so no two different recipes encode alike."""
    h = hashlib.sha256()
    h.update(b"harnessrl-recipe-3\0")
    _field(h, b"C", containerfile.read_bytes())
    _field(h, b"A", json.dumps({"args": dict(build_args), "bases": dict(base_ids)}, sort_keys=True).encode())
    for folder, dirs, files in sorted(os.walk(context)):
        dirs.sort()
        info = Path(folder).lstat()
        _field(h, b"D", Path(folder).relative_to(context).as_posix().encode(errors=_NAME_BYTES))
        _field(h, b"M", f"{stat.S_IMODE(info.st_mode):o}".encode())
        for name in sorted(files + [d for d in dirs if (Path(folder) / d).is_symlink()]):
            path = Path(folder) / name
            info = path.lstat()
            _field(h, b"N", path.relative_to(context).as_posix().encode(errors=_NAME_BYTES))
            _field(h, b"M", f"{stat.S_IMODE(info.st_mode):o}".encode())
            if stat.S_ISLNK(info.st_mode):
                _field(h, b"L", os.fsencode(os.readlink(path)))
            elif stat.S_ISREG(info.st_mode):
                _field(h, b"F", _file_sha256(path))
            else:
                _field(h, b"O", b"")  # a fifo or socket: COPY refuses it, its kind still counts
    return h.hexdigest()


def debian_digest(spec: Mapping[str, object]) -> str:
    return hashlib.sha256(b"harnessrl-debian-1\0" + json.dumps(spec, sort_keys=True).encode()).hexdigest()
