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
from typing import Literal


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
    """The simple commands of ``script``, in order; a rough split if ``shlex`` cannot parse it.

    The readers of heredocs inside ``"$( … )"`` come last, each with its body as stdin.
    """
    body, heredocs, quoted_readers = _split_heredocs(ansi_c_decoded(script))
    try:
        return _segments(_prepare_shell(body), heredocs) + quoted_readers
    except ValueError:  # unbalanced quotes: shlex gives up, a rough split still finds programs
        return [
            Segment(words=[w.strip("'\"") for w in piece.split() if w.strip("'\"")])
            for piece in re.split(r"&&|\|\||[;|&\n()`]", body)
        ] + quoted_readers


_ANSI_C_ESCAPES = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r",
                   "t": "\t", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}  # fmt: skip
_ANSI_C_ESCAPE = re.compile(
    r"\\(?:x([0-9a-fA-F]{1,2})|u([0-9a-fA-F]{1,4})|U([0-9a-fA-F]{1,8})|([0-7]{1,3})|c(.)|(.))", re.S
)


def ansi_c_decoded(script: str) -> str:
    """``script`` with each ANSI-C quoted word the shell reads (``$'\\x63url'``) written as the plain
    single-quoted text bash makes of it (``'curl'``): ``shlex`` knows no ``$'…'``, and
    ``$'\\x63url' http://x`` ran curl unseen. Inside other quotes or a comment it is text, as for bash.
    """
    if "$'" not in script:
        return script
    out: list[str] = []
    copied = 0
    resume: int | None = 0
    while resume is not None:
        start, resume = resume, None
        for i, role in _scan(script, start):
            if role != "code" or not script.startswith("$'", i):
                continue
            j, text = i + 2, []
            while j < len(script) and script[j] != "'":
                escape = _ANSI_C_ESCAPE.match(script, j) if script[j] == "\\" else None
                if escape is None:
                    text.append(script[j])
                    j += 1
                    continue
                text.append(_ansi_c_char(escape))
                j = escape.end()
            if j >= len(script):
                break  # unterminated: left as it is (shlex falls back to a rough split)
            decoded = "".join(text).replace("'", "'\"'\"'")
            out += [script[copied:i], f"'{decoded}'"]
            copied = resume = j + 1
            break
    out.append(script[copied:])
    return "".join(out)


def _ansi_c_char(escape: re.Match[str]) -> str:
    hex_byte, short, long, octal, control, other = escape.groups()
    try:
        if hex_byte or short or long:
            return chr(int(hex_byte or short or long, 16))
        if octal:
            return chr(int(octal, 8) & 0xFF)
    except (ValueError, OverflowError):
        return ""
    if control:
        return chr(ord(control) & 0x1F)
    return _ANSI_C_ESCAPES.get(other, "\\" + other)


def _split_heredocs(script: str) -> tuple[str, list[str], list[Segment]]:
    """Cut heredoc bodies out of the script (shlex would mangle them): (the rest, the bodies in order,
    the readers of heredocs inside double quotes).

    Only a ``<<`` the shell reads starts a heredoc: one inside quotes or a comment does not, or
    ``echo "<<EOF"`` and ``# see <<true`` would hide every command down to a line ``EOF``/``true``.
    Inside ``"$( … )"`` the shell reads it (``git commit -m "$(cat <<'EOF' … EOF)"``): that body is
    cut out too, and returned with the command that reads it (``"$(bash <<EOF …)"`` runs it), not
    among the bodies, which ``shlex`` hands to the ``<<`` it sees outside quotes. A body starts after
    the line that holds its ``<<`` and ends before the first line that is its delimiter; with no such
    line it was no heredoc (``1 << x`` in arithmetic), and the lines are kept.
    """
    starts: dict[str, list[int]] = {}  # stripped line -> where such lines start, to find terminators fast
    offset = 0
    for line in script.split("\n"):
        starts.setdefault(line.strip(), []).append(offset)
        offset += len(line) + 1
    kept: list[str] = []
    bodies: list[str] = []
    quoted_readers: list[Segment] = []
    readers: dict[int, list[str]] = {}  # where a quoted heredoc's command starts -> its words
    quoting = _Quoting()
    copied = 0  # script[:copied] is in ``kept`` or in ``bodies``
    resume: int | None = 0
    while resume is not None:
        chars = _scan(script, resume, quoting)
        command_start = resume  # after the last line break, ``$(`` or operator: where a reader starts
        resume = None
        # the heredocs opened on the current line: (delimiter, where its reader starts, the ``<<``, role)
        pending: list[tuple[str, int, int, CharRole]] = []
        for i, role in chars:
            if script[i] == "\n":
                command_start = i + 1
            if role not in _READ_BY_SHELL:
                continue
            if script.startswith("$(", i):
                command_start = i + 2
            elif script[i] in ";|&(":
                command_start = i + 1
            elif script[i] == "<" and (heredoc := _HEREDOC.match(script, i)):
                delimiter = heredoc.group(2) or heredoc.group(3) or heredoc.group(4)
                pending.append((delimiter, command_start, i, role))
            elif script[i] == "\n" and pending:
                body_start = i + 1
                for delimiter, reader_start, at_operator, opened_in in pending:
                    candidates = starts.get(delimiter, [])
                    at = bisect.bisect_left(candidates, body_start)
                    if at == len(candidates):
                        continue  # no terminator: not a heredoc after all; its lines stay commands
                    end = candidates[at]
                    kept.append(script[copied:body_start])
                    body = script[body_start : end - 1] if end > body_start else ""
                    if opened_in == "code":
                        bodies.append(body)
                    else:  # one parse per command: ``cat <<A <<B …`` shares its reader
                        if reader_start not in readers:
                            readers[reader_start] = _reader_words(script[reader_start:at_operator])
                        quoted_readers.append(Segment(words=list(readers[reader_start]), stdin=body))
                    after = script.find("\n", end)
                    body_start = copied = len(script) if after < 0 else after + 1
                resume = body_start  # scan on after the bodies, which the shell does not read as code
                break
    kept.append(script[copied:])
    return "".join(kept), bodies, quoted_readers


def _reader_words(command: str) -> list[str]:
    """The words of the simple command ``command`` ends with (a heredoc's reader)."""
    try:
        return _segments(_prepare_shell(command), [])[-1].words
    except ValueError:
        return command.split()


# What one character of shell text is to the shell (``_scan``).
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
_READ_BY_SHELL = ("code", "substituted")


@dataclass
class _Quoting:
    """Where a scan of shell text stands between two characters, so a scan can stop and resume."""

    quote: str | None = None  # "'" or '"' while inside quotes
    in_backtick: bool = False
    substitution_depth: int = 0  # open ``(`` of a ``$(`` inside the current double-quoted string


def _scan(text: str, start: int = 0, quoting: _Quoting | None = None) -> Iterator[tuple[int, CharRole]]:
    """Each character of ``text`` from ``start`` on, with its role; ``quoting`` carries the state.

    Quotes are tracked flat (a ``"`` inside ``"$( … )"`` ends the string), as ``shlex`` reads them
    later; the one nesting followed is ``$( … )`` inside double quotes, for heredocs.
    """
    state = quoting or _Quoting()
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


def _prepare_shell(text: str) -> str:
    """Unquoted newlines -> ``;``, comments dropped, backticks -> ``$( )``, continuations joined."""
    out: list[str] = []
    for i, role in _scan(text):
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


# ``NAME=value`` with a literal value (an empty one is what ``x=`cmd``` leaves after tokenizing).
_LITERAL_ASSIGNMENT = re.compile(r"([A-Za-z_]\w*)=([^$`]+)")
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_]\w*)(?::?[-=]([^}$`]*))?\}|([A-Za-z_]\w*))")
_DECLARE = wordlist("export declare local readonly typeset")


def expand_names(segments: list[Segment]) -> list[Segment]:
    """``segments`` with the variables and aliases the script itself defines from literals put in:
    ``c=curl; $c x`` and ``${c:-curl} x`` run curl, ``alias g=git`` then ``g log`` runs git log.
    An assignment counts from where it stands to the end of the script, whatever branch or
    function holds it (over-reading only flags more); a variable with any other value is left as
    it is (``$HOME``), and so is a function's body, which runs with arguments of its own."""
    values: dict[str, str] = {}
    aliases: dict[str, list[str]] = {}

    def put(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        if name in values:
            return values[name]
        return match.group(2) if match.group(2) is not None else match.group(0)

    expanded = []
    for segment in segments:
        words = [_VARIABLE.sub(put, w) if "$" in w else w for w in segment.words]
        first = 0
        while first < len(words) and (words[first] in _KEYWORDS or _ASSIGNMENT.match(words[first])):
            first += 1
        if first < len(words) and "$" in segment.words[first] and len(words[first].split()) > 1:
            words[first : first + 1] = words[first].split()  # ``cmd="git log"; $cmd``: split as bash does
        if first < len(words) and words[first] in aliases:
            words[first : first + 1] = aliases[words[first]]
        declared = words[first + 1 :] if first < len(words) and words[first] in _DECLARE else []
        for word in [*words[:first], *declared]:
            if assigned := _LITERAL_ASSIGNMENT.fullmatch(word):
                values[assigned.group(1)] = assigned.group(2)
        if first < len(words) and words[first] == "alias":
            for definition in words[first + 1 :]:
                name, equals, value = definition.partition("=")
                if equals and value.split():
                    aliases[name] = value.split()
        expanded.append(Segment(words, segment.redirects, segment.inputs, segment.stdin, segment.piped))
    return expanded


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
