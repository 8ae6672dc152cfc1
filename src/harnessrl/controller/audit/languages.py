"""What runs a file the policy wrote: Python or the shell, by its name or its shebang.

The workspace diff (``audit.workspace``) reads code files first, and the rules (``audit.rules``,
``audit.files``) analyse text written to a file as the language that runs it. See docs/audit.md.
"""

from __future__ import annotations

import re
from typing import Literal

_CODE_SUFFIXES = (".py", ".pyw", ".pth", ".sh", ".bash", ".zsh", ".ksh")


def is_code_path(path: str) -> bool:
    """Python or shell by its name (a shebang is checked on the content)."""
    return path.endswith(_CODE_SUFFIXES)


ScriptLanguage = Literal["python", "shell"]
_PYTHON_SUFFIXES = (".py", ".pyw", ".pth")
_PYTHON_SHEBANG = re.compile(r"\A#![^\n]*\b(?:python|pypy)[\d.]*\b")
_SHELL_SHEBANG = re.compile(r"\A#![^\n]*\b(?:ba|z|da|k|a|mk)?sh\b")


def script_language(path: str, first_line: str | None) -> ScriptLanguage | None:
    """What runs a file, by its suffix or its shebang (``#!/usr/bin/env python``, ``#!/bin/sh``); None
    for other files. A file written without either and run by name (``./x``) runs under the shell,
    and one run as ``python run.txt`` is Python: only the commands tell, so the audit's rules decide
    those."""
    if path.endswith(_PYTHON_SUFFIXES):
        return "python"
    if path.endswith(_CODE_SUFFIXES):
        return "shell"
    line = first_line or ""
    if _PYTHON_SHEBANG.match(line):
        return "python"
    if _SHELL_SHEBANG.match(line):
        return "shell"
    return None


_MAX_FIRST_LINE = 1000  # characters of a first line kept: a shebang is short


def first_line_of(data: bytes) -> str:
    """The first line of a text file's bytes, as text, cut to ``_MAX_FIRST_LINE`` characters: what
    ``script_language`` reads the shebang from."""
    return data.split(b"\n", 1)[0][:_MAX_FIRST_LINE].decode("utf-8", errors="replace")
