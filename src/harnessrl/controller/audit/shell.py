"""Shell syntax for the reward-hack audit: a script becomes simple commands, wrappers are stripped.

Only syntax, no rules: ``shell_segments`` cuts heredocs out, drops comments, turns unquoted line
breaks into ``;`` and backticks into ``$( )``, then tokenizes with ``shlex`` into ``Segment``s (words,
output redirections, input files, stdin text when known). Unparsable shell (unbalanced quotes) falls back to
splitting on operators and whitespace. The helpers below answer the questions the rules ask of one
command: which program runs under ``sudo``/``timeout``/``uv run``, what literal text it pipes on,
which script ``bash -c`` runs, which arguments are positional. ``audit.rules`` decides what to flag.
"""

from __future__ import annotations

import bisect
import posixpath
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field


def wordlist(text: str) -> tuple[str, ...]:
    """``"a b c"`` -> ``("a", "b", "c")``: the audit's tables of names are written as one string."""
    return tuple(text.split())


# Prefixes that run the rest of the line as a command, with their options that take a value.
_WRAPPERS: dict[str, set[str]] = {
    "sudo": {"-u", "-g", "-C", "-D", "-h", "-p", "-U", "-r", "-t"},
    "doas": {"-u", "-C"},
    "env": {"-u", "-C", "-S", "--unset", "--chdir"},
    "timeout": {"-s", "-k", "--signal", "--kill-after"},
    "nohup": set(),
    "time": {"-f", "-o"},
    "nice": {"-n", "--adjustment"},
    "ionice": {"-c", "-n", "-p"},
    "command": set(),
    "exec": {"-a"},
    "builtin": set(),
    "stdbuf": {"-i", "-o", "-e"},
    "xargs": {"-I", "-n", "-P", "-d", "-L", "-s", "-E", "-a", "--max-args", "--delimiter"},
    "setsid": set(),
    "chronic": set(),
    "unbuffer": set(),
    "watch": {"-n", "-d", "--interval"},
    "strace": {"-o", "-e", "-p", "-s"},
    "ltrace": {"-o", "-e"},
    "busybox": set(),
}
_RUNNERS = wordlist("uv poetry pipenv pdm hatch conda mamba micromamba rye pixi")  # X run
_RUNNER_OPTS = wordlist("-n --name -p --prefix --with --python -e --env --project --directory --from")
_KEYWORDS = wordlist("if then else elif fi do done while until ! { } $ ( )")
_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
_HEREDOC = re.compile(r"(?<!<)<<(?!<)(-?)[ \t]*(?:'([^'\n]+)'|\"([^\"\n]+)\"|\\?([A-Za-z_][\w.-]*))")
_OPERATOR_CHARS = frozenset("();<>|&")


@dataclass
class Segment:
    """One simple command: words, output redirections, input files, its stdin text if known."""

    words: list[str] = field(default_factory=list)
    redirects: list[tuple[str, str]] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)  # ``< FILE`` targets
    stdin: str | None = None
    piped: bool = False  # stdin is the previous segment's output


def shell_segments(script: str) -> list[Segment]:
    """The simple commands of ``script``, in order; a rough split if ``shlex`` cannot parse it."""
    body, heredocs = _split_heredocs(script)
    try:
        return _segments(_prepare_shell(body), heredocs)
    except ValueError:  # unbalanced quotes: shlex gives up, a rough split still finds programs
        return [
            Segment(words=[w.strip("'\"") for w in piece.split() if w.strip("'\"")])
            for piece in re.split(r"&&|\|\||[;|&\n()`]", body)
        ]


def _split_heredocs(script: str) -> tuple[str, list[str]]:
    """Cut heredoc bodies out of the script (shlex would mangle them); return them in order."""
    lines, kept, bodies = script.split("\n"), [], []
    where: dict[str, list[int]] = {}  # stripped line -> its line numbers, to find terminators fast
    for number, line in enumerate(lines):
        where.setdefault(line.strip(), []).append(number)
    i = 0
    while i < len(lines):
        line = lines[i]
        kept.append(line)
        i += 1
        for match in _HEREDOC.finditer(line):
            candidates = where.get(match.group(2) or match.group(3) or match.group(4), [])
            end = next((n for n in candidates[bisect.bisect_left(candidates, i) :]), None)
            if end is not None:
                bodies.append("\n".join(lines[i:end]))
                i = end + 1
            # no terminator: not a heredoc after all (``1 << x`` inside a string); keep the lines
    return "\n".join(kept), bodies


def _prepare_shell(text: str) -> str:
    """Unquoted newlines -> ``;``, comments dropped, backticks -> ``$( )``, continuations joined."""
    out: list[str] = []
    quote: str | None = None
    in_backtick = False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if quote == "'":
            quote = None if c == "'" else quote
        elif quote == '"':
            if c == "\\" and i + 1 < n:
                out.append(text[i : i + 2])
                i += 2
                continue
            quote = None if c == '"' else quote
        elif c == "\\" and i + 1 < n:
            if text[i + 1] != "\n":
                out.append(text[i : i + 2])
            i += 2
            continue
        elif c in "'\"":
            quote = c
        elif c == "\n":
            c = " ; "
        elif c == "#" and (i == 0 or text[i - 1] in " \t\n;&|("):
            while i < n and text[i] != "\n":
                i += 1
            continue
        elif c == "`":
            c = " ) " if in_backtick else " $( "
            in_backtick = not in_backtick
        out.append(c)
        i += 1
    return "".join(out)


def _segments(text: str, heredocs: list[str]) -> list[Segment]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    tokens = list(lexer)
    segments = [Segment()]
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not set(token) <= _OPERATOR_CHARS:
            segments[-1].words.append(token)
            i += 1
            continue
        nxt = tokens[i + 1] if i + 1 < len(tokens) and not set(tokens[i + 1]) <= _OPERATOR_CHARS else None
        current = segments[-1]
        if token in ("<<", "<<-", "<<<"):
            current.stdin = nxt if token == "<<<" else (heredocs.pop(0) if heredocs else None)
        elif ("<" in token or ">" in token) and "(" not in token and nxt is not None:
            if current.words and current.words[-1].isdigit():
                current.words.pop()  # the fd of ``2>``
            if not re.fullmatch(r"\d+|-", nxt):  # not an fd duplication (``2>&1``, ``<&3``)
                if ">" in token:
                    current.redirects.append((token, nxt))
                else:
                    current.inputs.append(nxt)
        else:
            segments.append(Segment(piped="|" in token and "||" not in token))
            i += 1
            continue
        i += 2 if nxt is not None else 1
    return segments


def substitutions(word: str) -> Iterator[str]:
    """The commands inside ``$(...)`` and backticks of one (quoted) word."""
    start = word.find("$(")
    while start >= 0:
        depth, end = 0, len(word)
        for j in range(start + 1, len(word)):
            depth += {"(": 1, ")": -1}.get(word[j], 0)
            if depth == 0:
                end = j
                break
        yield word[start + 2 : end]
        start = word.find("$(", end)
    yield from re.findall(r"`([^`]*)`", word)


def strip_wrappers(words: list[str]) -> list[str]:
    i = 0
    while i < len(words):
        word, base = words[i], posixpath.basename(words[i])
        if word in _KEYWORDS or _ASSIGNMENT.match(word):
            i += 1
        elif base in _WRAPPERS:
            if base == "command" and i + 1 < len(words) and words[i + 1] in ("-v", "-V"):
                return []  # ``command -v curl`` only asks whether curl exists
            i += 1
            while i < len(words) and words[i].startswith("-") and words[i] != "-":
                i += 2 if words[i] in _WRAPPERS[base] else 1
            if base == "timeout":
                i += 1  # the duration
        elif base in _RUNNERS and i + 1 < len(words) and words[i + 1] == "run":
            i += 2
            while i < len(words) and words[i].startswith("-"):
                i += 2 if words[i] in _RUNNER_OPTS else 1
        else:
            break
    return words[i:]


def output_of(segment: Segment) -> str | None:
    """What a segment writes to a pipe, when it is literal (``echo X |``, ``cat <<EOF |``)."""
    words = strip_wrappers(segment.words)
    prog = posixpath.basename(words[0]) if words else ""
    if prog in ("echo", "printf"):
        return " ".join(a for a in words[1:] if not re.fullmatch(r"-[neE]+", a))
    return segment.stdin if prog == "cat" else None


def shell_script(args: list[str], stdin: str | None) -> str | None:
    """The script ``bash [-lc] SCRIPT`` / ``bash <<EOF`` / ``echo X | sh`` runs (None: a file)."""
    has_c = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file"):
            i += 2
            continue
        if arg.startswith("-") and len(arg) > 1 and not arg.startswith("--"):
            has_c = has_c or "c" in arg[1:]
        elif not arg.startswith("--"):
            return arg if has_c else None
        i += 1
    return stdin


def positional_args(args: list[str], takes_value: set[str]) -> tuple[list[str], list[str]]:
    """(positional arguments, values of the options in ``takes_value``)."""
    positional, values = [], []
    i = 0
    while i < len(args):
        if args[i] in takes_value and i + 1 < len(args):
            values.append(args[i + 1])
            i += 2
            continue
        if not args[i].startswith("-") or args[i] == "-":
            positional.append(args[i])
        i += 1
    return positional, values
