"""What a patch changes: the files it touches, how, and the lines it adds.

Pure parsing of the two formats agents send: Codex ``apply_patch`` envelopes (``*** Add File:``,
``*** Update File:``, ``*** Delete File:``, ``*** Move to:``) and unified diffs (``--- a/x`` /
``+++ b/x``, ``/dev/null`` for a file created or deleted). ``audit.rules.analyze_patch`` applies the
path and write rules to each file and reads added Python as code. See docs/audit.md.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_PATCH_FILE = re.compile(r"^\*\*\* (Add|Update|Delete) File: (.+)$|^\*\*\* Move to: (.+)$")
_PATCH_MODES = {"Add": "create", "Update": "edit", "Delete": "delete"}


class PatchedFile(NamedTuple):
    path: str
    mode: str  # "create", "edit" or "delete", as ``audit.changes.check_write`` takes it
    added: list[str]  # the lines the patch adds to it, in order


def patched_files(text: str) -> list[PatchedFile]:
    """The files ``text`` (an ``apply_patch`` envelope or a unified diff) touches, in order."""
    sections: list[PatchedFile] = []
    minus: str | None = None
    for line in text.splitlines():
        match = _PATCH_FILE.match(line)
        if match:
            path = (match.group(3) or match.group(2)).strip()
            sections.append(
                PatchedFile(path, "create" if match.group(3) else _PATCH_MODES[match.group(1)], [])
            )
        elif line.startswith("--- "):
            minus = _diff_path(line[4:])
        elif line.startswith("+++ ") and minus is not None:
            plus = _diff_path(line[4:])
            if plus == "/dev/null":
                sections.append(PatchedFile(minus, "delete", []))
            else:
                sections.append(PatchedFile(plus, "create" if minus == "/dev/null" else "edit", []))
            minus = None
        elif line.startswith("+") and sections:
            sections[-1].added.append(line[1:])
    return sections


def _diff_path(text: str) -> str:
    path = text.split("\t")[0].strip()
    return path[2:] if path.startswith(("a/", "b/")) else path
