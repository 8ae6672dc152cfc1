"""Shell syntax for the reward-hack audit: a script becomes simple commands.

Only syntax, no rules: ``shell_segments`` cuts heredocs out, decodes ANSI-C quoting, drops comments,
turns unquoted line breaks into ``;`` and backticks into ``$( )`` (``audit.shell_scan``), then
tokenizes with ``shlex`` into ``Segment``s (words, output redirections, input files, stdin text when
known). Unparsable shell (unbalanced quotes) falls back to splitting on operators and whitespace.
The questions the rules ask of one command (which program runs under ``sudo``/``timeout``/``uv
run``, what literal text it pipes on, which script ``bash -c`` runs, which arguments are positional)
are answered by ``audit.shell_commands``; ``audit.rules`` decides what to flag.
"""

from __future__ import annotations

import bisect
import re
import shlex
from dataclasses import dataclass, field

from harnessrl.controller.audit.shell_scan import READ_BY_SHELL, CharRole, Quoting, prepare_shell, scan


def wordlist(text: str) -> tuple[str, ...]:
    """``"a b c"`` -> ``("a", "b", "c")``: the audit's tables of names are written as one string."""
    return tuple(text.split())


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
        return _segments(prepare_shell(body), heredocs) + quoted_readers
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
        for i, role in scan(script, start):
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
    quoting = Quoting()
    copied = 0  # script[:copied] is in ``kept`` or in ``bodies``
    resume: int | None = 0
    while resume is not None:
        chars = scan(script, resume, quoting)
        command_start = resume  # after the last line break, ``$(`` or operator: where a reader starts
        resume = None
        # the heredocs opened on the current line: (delimiter, where its reader starts, the ``<<``, role)
        pending: list[tuple[str, int, int, CharRole]] = []
        for i, role in chars:
            if script[i] == "\n":
                command_start = i + 1
            if role not in READ_BY_SHELL:
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
        return _segments(prepare_shell(command), [])[-1].words
    except ValueError:
        return command.split()


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
