"""The questions the audit's rules ask of one simple command (``audit.shell.Segment``): which program
runs under ``sudo``/``timeout``/``uv run`` (``strip_wrappers``), what literal text it pipes on
(``output_of``), which script ``bash -c`` runs (``shell_script``), which arguments are positional
(``positional_args``), what runs inside ``$(...)`` (``substitutions``), and the commands with the
script's own literal variables and aliases put in (``expand_names``), and a script with its program
lookups (``$(which curl)``) spelled as the program (``lookups_spelled_out``). Syntax only: ``audit.rules``
decides what to flag.
"""

from __future__ import annotations

import posixpath
import re
import shlex
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
        if first < len(words) and "$" in segment.words[first]:
            split = _split_as_bash(words[first], values.get("IFS"))
            if len(split) > 1:  # ``cmd="git log"; $cmd`` (``IFS=,; c=git,log; $c``): split as bash does
                words[first : first + 1] = split
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


def _split_as_bash(word: str, ifs: str | None) -> list[str]:
    """The fields bash splits an expanded word into: on whitespace, and on ``IFS``'s characters when
    the script sets it."""
    if not ifs:
        return word.split()
    return [field for field in re.split(f"[{re.escape(ifs)}\\s]+", word) if field]


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


# ``f() {``, ``f () (``, ``function f {``, ``function f() {``: where a shell function's body opens.
_FUNCTION_OPENS = re.compile(
    r"(?:\bfunction[ \t]+([\w.:-]+)(?:[ \t]*\([ \t]*\))?|(?<![\w.:$-])([\w.:-]+)[ \t]*\([ \t]*\))\s*([{(])"
)
# ``"$@"``, ``$*``, ``${@}``: every argument; ``"$1"``, ``$2``, ``${3}``: one.
_ALL_ARGUMENTS = re.compile(r"\"\$(?:@|\{@\}|\*|\{\*\})\"|\$(?:@|\{@\}|\*|\{\*\})")
_ONE_ARGUMENT = re.compile(r"\"\$(?:(\d)|\{(\d+)\})\"|\$(?:(\d)|\{(\d+)\})")


def script_functions(script: str) -> dict[str, str]:
    """The shell functions ``script`` defines, by name: each one's body (the last definition wins)."""
    closes = {**_matching_closes(script, "{", "}"), **_matching_closes(script, "(", ")")}
    functions: dict[str, str] = {}
    for opened in _FUNCTION_OPENS.finditer(script):
        name = opened.group(1) or opened.group(2)
        functions[name] = script[opened.end() : closes.get(opened.end() - 1, len(script))]
    return functions


def _matching_closes(script: str, opener: str, closer: str) -> dict[int, int]:
    """Where each ``opener`` in ``script`` is closed (one pass: a script of 200,000 unclosed braces
    costs no more than its length)."""
    closes: dict[int, int] = {}
    open_at: list[int] = []
    for at, char in enumerate(script):
        if char == opener:
            open_at.append(at)
        elif char == closer and open_at:
            closes[open_at.pop()] = at
    return closes


def uses_arguments(body: str) -> bool:
    """Whether a function's ``body`` reads the arguments it is called with (``"$@"``, ``$1``)."""
    return _ALL_ARGUMENTS.search(body) is not None or _ONE_ARGUMENT.search(body) is not None


def function_called(body: str, args: list[str]) -> str:
    """``body`` as it runs when called with ``args``: ``"$@"``, ``$1``, ``${2}`` put in, so that
    ``f() { "$@"; }; f curl x`` reads as ``curl x``."""

    def one(match: re.Match[str]) -> str:
        index = int(next(g for g in match.groups() if g is not None))
        value = args[index - 1] if 0 < index <= len(args) else ""
        return shlex.quote(value) if match.group(0).startswith('"') else value

    quoted = " ".join(shlex.quote(a) for a in args)
    return _ONE_ARGUMENT.sub(one, _ALL_ARGUMENTS.sub(lambda m: quoted, body))


_MAX_XARGS_LINES = 32  # lines of a literal input read as the commands ``xargs -I`` runs


def xargs_commands(wrappers: list[str], words: list[str], stdin: str) -> list[list[str]]:
    """The commands ``xargs`` among ``wrappers`` runs as ``words`` given the literal ``stdin``: its
    words appended (``echo .git/x | xargs cat``), or each line put for ``-I``'s placeholder."""
    at = next((i for i, w in enumerate(wrappers) if posixpath.basename(w) == "xargs"), None)
    if at is None:
        return []
    options = wrappers[at + 1 :]
    placeholder = next(
        (options[i + 1] for i, o in enumerate(options[:-1]) if o == "-I"),
        next((o[2:] for o in options if o.startswith("-I") and len(o) > 2), None),
    )
    stdin = stdin.replace("\\n", "\n").replace("\\t", "\t")  # ``printf 'log\n'`` as printf writes it
    if placeholder is None:
        return [words + stdin.split()]
    lines = [line.strip() for line in stdin.splitlines() if line.strip()][:_MAX_XARGS_LINES]
    return [[w.replace(placeholder, line) for w in words] for line in lines]


# ``$(which curl) x``, ```command -v git` log``: the program's path looked up, then run. Read as the
# program's name (``c=$(which curl); $c x`` then expands to it too); where the lookup is only printed
# (``echo $(which curl)``), the name is an argument, which no rule reads as a program.
_LOOKED_UP = re.compile(
    r"\$\(\s*(?:which|command[ \t]+-v|type[ \t]+-[pP])[ \t]+([\w.+-]+)\s*\)"
    r"|`\s*(?:which|command[ \t]+-v|type[ \t]+-[pP])[ \t]+([\w.+-]+)\s*`"
)


_READ_SUBSTITUTION = re.compile(r"\$\(\s*<(?!<)")


def lookups_spelled_out(script: str) -> str:
    """``script`` with each program lookup run as the program (``$(which curl) x`` -> ``curl x``)
    and bash's ``$(< FILE)`` as the ``$(cat < FILE)`` it means."""
    script = _LOOKED_UP.sub(lambda m: m.group(1) or m.group(2), script)
    return _READ_SUBSTITUTION.sub("$(cat <", script)  # bash's ``$(< FILE)`` is ``$(cat FILE)``
