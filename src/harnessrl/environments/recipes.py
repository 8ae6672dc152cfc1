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
from pathlib import Path, PurePosixPath

from harnessrl.environments.podman import ImageError

_INSTRUCTION = re.compile(r"^\s*([A-Za-z]+)\s+(.*)$", re.S)
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::([-+])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
_COPY_FROM = re.compile(r"(--from=)([^\s\]\"',]+)")
_MOUNT_FROM = re.compile(r"(--mount=\S*?\bfrom=)([^\s,]+)")
# A file name is bytes: one that is not UTF-8 (``caf\xe9.txt``) is hashed as its own bytes (strict
# UTF-8 raised UnicodeEncodeError, a traceback out of images build); UTF-8 names hash as before.
_NAME_BYTES = "surrogateescape"


def _lines(containerfile: Path) -> list[str]:
    """The Containerfile's lines, without the byte order mark an editor may put first: podman reads
    past it, and with it the first ``FROM`` was no instruction here (its base missing from the
    digest and never pinned: a rebuilt base left the image stale)."""
    return containerfile.read_text(errors="replace").removeprefix("\ufeff").splitlines()


def instructions(containerfile: Path) -> list[tuple[int, str, str]]:
    """``(line number, INSTRUCTION, arguments)`` for each instruction; continuation lines joined,
    comments and parser directives left out."""
    out: list[tuple[int, str, str]] = []
    pending, start = "", 0
    for number, line in enumerate(_lines(containerfile), start=1):
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        pending += stripped
        match = _INSTRUCTION.match(pending)
        if match:
            out.append((start, match.group(1).upper(), match.group(2).strip()))
        pending = ""
    return out


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
    value: the build argument, else the default, else None."""
    values: dict[str, str | None] = {}
    for number, name, args in instructions(containerfile):
        if name == "FROM":
            break
        if name != "ARG":
            continue
        for word in _words(args, f"ARG on line {number}"):
            key, has_default, default = word.partition("=")
            values[key] = build_args.get(key, default if has_default else None)
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


def base_images(containerfile: Path, build_args: Mapping[str, str] | None = None) -> list[str]:
    """The images a recipe reads, each once: ``FROM`` of each stage, ``COPY --from=<image>`` and
    ``RUN --mount=...,from=<image>`` (stage names and indexes, and ``scratch``, left out)."""
    values = _global_args(containerfile, build_args or {})
    stages: set[str] = set()
    images: list[str] = []

    def add(image: str) -> None:
        own_stage = image.lower() in stages or image.isdigit()  # a stage by name or by index
        if image and not own_stage and image != "scratch" and image not in images:
            images.append(image)

    for number, name, args in instructions(containerfile):
        if name == "FROM":
            image, stage = _from_image(args, values, number)
            add(image)
            if stage:
                stages.add(stage)
        elif name in ("COPY", "ADD"):
            for match in _COPY_FROM.finditer(args):
                add(match.group(2))
        elif name == "RUN":
            for match in _MOUNT_FROM.finditer(args):
                add(match.group(2))
    return images


def pin_images(containerfile: Path, image_ids: Mapping[str, str], build_args: Mapping[str, str]) -> str:
    """The Containerfile's text with each image of ``image_ids`` (as ``base_images`` names it) that a
    ``FROM``, ``COPY --from`` or ``RUN --mount from=`` reads replaced by its id. Lines are kept as
    they are (line numbers in build errors still match); only an instruction's first line is read."""
    values = _global_args(containerfile, build_args)
    out: list[str] = []
    continued = False
    for number, line in enumerate(_lines(containerfile), start=1):
        match = None if continued else _INSTRUCTION.match(line)
        continued = line.rstrip().endswith("\\")
        if match is None or line.lstrip().startswith("#"):
            out.append(line)
            continue
        name = match.group(1).upper()
        if name == "FROM":
            image, _ = _from_image(match.group(2), values, number)
            if image in image_ids:
                words = match.group(2).split()
                at = next(i for i, w in enumerate(words) if not w.startswith("--"))
                words[at] = image_ids[image]
                line = line[: match.start(2)] + " ".join(words)
        elif name in ("COPY", "ADD"):
            line = _COPY_FROM.sub(lambda m: m.group(1) + image_ids.get(m.group(2), m.group(2)), line)
        elif name == "RUN":
            line = _MOUNT_FROM.sub(lambda m: m.group(1) + image_ids.get(m.group(2), m.group(2)), line)
        out.append(line)
    return "\n".join(out) + "\n"


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


def recipe_digest(
    containerfile: Path, context: Path, build_args: Mapping[str, str], base_ids: Mapping[str, str]
) -> str:
    """sha256 over what the build reads (see the module docstring), hex. Folders count too, empty
    ones included (``COPY . /app`` makes them, with their modes)."""
    h = hashlib.sha256()
    h.update(b"harnessrl-recipe-2\0")
    h.update(containerfile.read_bytes())
    h.update(json.dumps({"args": dict(build_args), "bases": dict(base_ids)}, sort_keys=True).encode())
    for folder, dirs, files in sorted(os.walk(context)):
        dirs.sort()
        info = Path(folder).lstat()
        rel = Path(folder).relative_to(context).as_posix()
        h.update(f"\0{rel}/\0{stat.S_IMODE(info.st_mode):o}\0".encode(errors=_NAME_BYTES))
        for name in sorted(files + [d for d in dirs if (Path(folder) / d).is_symlink()]):
            path = Path(folder) / name
            rel = path.relative_to(context).as_posix()
            info = path.lstat()
            h.update(f"\0{rel}\0{stat.S_IMODE(info.st_mode):o}\0".encode(errors=_NAME_BYTES))
            if stat.S_ISLNK(info.st_mode):
                h.update(b"link:" + os.fsencode(os.readlink(path)))
            elif stat.S_ISREG(info.st_mode):
                with path.open("rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
    return h.hexdigest()


def debian_digest(spec: Mapping[str, object]) -> str:
    return hashlib.sha256(b"harnessrl-debian-1\0" + json.dumps(spec, sort_keys=True).encode()).hexdigest()
