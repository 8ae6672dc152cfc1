"""Shell text read character by character, as the shell reads it: which characters are code, quoted,
escaped, a comment, a backtick (``scan``), and the text ``shlex`` can tokenize (``prepare_shell``:
unquoted newlines as ``;``, comments dropped, backticks as ``$( )``). ``audit.shell`` builds the
simple commands of a script on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

# What one character of shell text is to the shell (``scan``).
CharRole = Literal[
    "code",  # read by the shell
    "quoted",  # inside quotes (the quote characters included)
    "substituted",  # inside ``$( … )`` within double quotes: read by the shell, but part of a word
    "escaped",  # a backslash and the character it escapes
    "joined",  # a backslash-newline (line continuation)
    "comment",
    "backtick_open",
    "backtick_close",
]
READ_BY_SHELL = ("code", "substituted")


@dataclass
class Quoting:
    """Where a scan of shell text stands between two characters, so a scan can stop and resume."""

    quote: str | None = None  # "'" or '"' while inside quotes
    in_backtick: bool = False
    substitution_depth: int = 0  # open ``(`` of a ``$(`` inside the current double-quoted string


def scan(text: str, start: int = 0, quoting: Quoting | None = None) -> Iterator[tuple[int, CharRole]]:
    """Each character of ``text`` from ``start`` on, with its role; ``quoting`` carries the state.

    Quotes are tracked flat (a ``"`` inside ``"$( … )"`` ends the string), as ``shlex`` reads them
    later; the one nesting followed is ``$( … )`` inside double quotes, for heredocs.
    """
    state = quoting or Quoting()
    i, n = start, len(text)
    while i < n:
        c = text[i]
        if state.quote == "'":
            state.quote = None if c == "'" else state.quote
            yield i, "quoted"
        elif state.quote == '"':
            role: CharRole = "substituted" if state.substitution_depth else "quoted"
            if c == "\\" and i + 1 < n:
                yield i, role
                yield i + 1, role
                i += 2
                continue
            if c == '"':
                state.quote, state.substitution_depth, role = None, 0, "quoted"
            elif c == "$" and text.startswith("$(", i):
                state.substitution_depth += 1
                yield i, "substituted"
                yield i + 1, "substituted"
                i += 2
                continue
            elif c == "(" and state.substitution_depth:
                state.substitution_depth += 1
            elif c == ")" and state.substitution_depth:
                state.substitution_depth -= 1
            yield i, role
        elif c == "\\" and i + 1 < n:
            role = "joined" if text[i + 1] == "\n" else "escaped"
            yield i, role
            yield i + 1, role
            i += 2
            continue
        elif c in "'\"":
            state.quote = c
            yield i, "quoted"
        elif c == "#" and (i == 0 or text[i - 1] in " \t\n;&|("):
            while i < n and text[i] != "\n":
                yield i, "comment"
                i += 1
            continue
        elif c == "`":
            state.in_backtick = not state.in_backtick
            yield i, "backtick_open" if state.in_backtick else "backtick_close"
        else:
            yield i, "code"
        i += 1


def prepare_shell(text: str) -> str:
    """Unquoted newlines -> ``;``, comments dropped, backticks -> ``$( )``, continuations joined."""
    out: list[str] = []
    for i, role in scan(text):
        if role in ("comment", "joined"):
            continue
        c = text[i]
        if role == "code" and c == "\n":
            c = " ; "
        elif role == "backtick_open":
            c = " $( "
        elif role == "backtick_close":
            c = " ) "
        out.append(c)
    return "".join(out)
