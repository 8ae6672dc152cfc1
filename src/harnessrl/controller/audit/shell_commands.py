"""The questions the audit's rules ask of one simple command (``audit.shell.Segment``): which program
runs under ``sudo``/``timeout``/``uv run`` (``strip_wrappers``), what literal text it pipes on
(``output_of``), which script ``bash -c`` runs (``shell_script``), which arguments are positional
(``positional_args``), what runs inside ``$(...)`` (``substitutions``), and the commands with the
script's own literal variables and aliases put in (``expand_names``). Syntax only: ``audit.rules``
decides what to flag.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator

from harnessrl.controller.audit.shell import Segment, wordlist

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
    "fakeroot": {"-l", "--lib", "--faked", "-s", "-i"},
    # ``systemd-run [--user] [-p PROP] CMD``: its long options are usually ``--opt=value``
    "systemd-run": {"-p", "--property", "-u", "--unit", "-E", "--setenv", "-M", "--machine", "-H", "--host"},
    "setpriv": set(),  # ``setpriv --reuid=1000 CMD``
}
_RUNNERS = wordlist("uv poetry pipenv pdm hatch conda mamba micromamba rye pixi")  # X run
_RUNNER_OPTS = wordlist("-n --name -p --prefix --with --python -e --env --project --directory --from")
_KEYWORDS = wordlist("if then else elif fi do done while until ! { } $ ( )")
_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")


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
        elif word == "function" and i + 1 < len(words):
            i += 2  # ``function f { curl x; }``: the body runs (the name is no program)
        elif word == "coproc":
            # ``coproc curl x`` runs curl; ``coproc NAME { curl x; }`` names the coprocess first
            i += 2 if i + 2 < len(words) and words[i + 2] in ("{", "(") else 1
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
