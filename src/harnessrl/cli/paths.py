"""Output paths a user names on the command line, checked before a command creates or starts anything:
one under an existing file (``f/out``) can never be written, and used to end in a traceback from
``mkdir`` after the work was done."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from harnessrl.errors import ConfigError


def check_output_path(path: str | Path, option: str, *, kind: Literal["file", "folder"] = "file") -> None:
    """``ConfigError`` naming ``option`` when ``path`` lies under a file, or is a folder where a file
    goes. ``..`` is not resolved, as the OS does not resolve it either: ``f/../x`` is under the file ``f``."""
    path = Path(path).absolute()  # as the command writes it (no ~ expansion)
    existing = next(p for p in (path, *path.parents) if p.exists())  # "/" at the latest
    if existing != path and not existing.is_dir():
        raise ConfigError(f"{option}: {str(existing)!r} is a file, not a folder")
    if existing == path and kind == "file" and path.is_dir():
        raise ConfigError(f"{option}: {str(path)!r} is a folder, not a file")
