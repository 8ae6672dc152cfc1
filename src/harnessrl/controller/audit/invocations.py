"""What a command line, or a piece of code, runs: the code the audit's rules must read next.

Pure parsing, no rules: ``audit.rules`` decides what to flag and analyses what these functions find,
recursively. ``audit.shell`` strips the common wrappers (``env``, ``nohup``, ``uv run``...) and finds
the script of ``bash -c``; this module covers the programs that run another command with arguments
of their own before it or as one string (``script -c``, ``su -c``, ``flock``, ``taskset``, ``env
-S``), what ``python [options] …`` runs (code, a module, a file or stdin), the shell a notebook cell
runs (cell magics and ``!`` escapes), the files a shell script runs (so that code it wrote to them is
read as what runs it), and the shell commands that awk, perl, ruby, node, php or lua one-liners run.
The shell commands Python code runs (``os.system``, ``subprocess``) are ``audit.python_calls``'.
See docs/audit.md.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator

from harnessrl.controller.audit.shell import Segment, wordlist
from harnessrl.controller.audit.shell_commands import positional_args, shell_script, strip_wrappers

SHELLS = wordlist("sh bash zsh dash ksh ash mksh fish")
PYTHON_EXE = re.compile(r"^(?:python|pypy)(?:\d+(?:\.\d+)*)?$|^ipython3?$")

# ---------------------------------------------------------------------------------------------------
# Programs that run another command (``audit.shell`` strips the common wrappers; these have arguments
# of their own before the command, or take it as one string)
# ---------------------------------------------------------------------------------------------------

# ``script -qc CMD``, ``su -c CMD``: the command is one string after ``-c``.
_STRING_RUNNERS = wordlist("script su runuser sg")
# ``flock FILE CMD...``/``flock FILE -c CMD``, ``taskset MASK CMD...``, ``chrt PRIO CMD...``: options,
# then one positional argument of their own, then the command's words.
_POSITIONAL_RUNNERS: dict[str, set[str]] = {
    "flock": {"-w", "--timeout", "-E", "--conflict-exit-code"},
    "taskset": set(),
    "chrt": set(),
}


# ``runuser -u USER [--] CMD...``: options (these take a value), then the command's words.
_RUNUSER_VALUE_OPTS = wordlist("-u --user -g --group -G --supp-group -s --shell -w --whitelist-environment")
# ``parallel [options] CMD ::: ARGS``: these options take a value.
_PARALLEL_VALUE_OPTS = wordlist(
    "-j --jobs -P --max-procs -a --arg-file -d --delimiter -I --replace -S --sshlogin --colsep -C"
    " --joblog --results --tmpdir -N -n --max-args -L --max-lines -E --timeout --delay --retries"
    " --sshloginfile --slf --workdir --wd --env --basefile --bf --tagstring --halt"
)


def wrapped_command(prog: str, args: list[str]) -> str | list[str] | None:
    """What ``prog`` runs: a shell string, the words of a command, or None (it is not a runner)."""
    if prog in _STRING_RUNNERS or prog == "flock":
        for i, arg in enumerate(args):
            if arg.startswith("--command="):
                return arg.split("=", 1)[1]
            if (arg == "--command" or re.fullmatch(r"-[A-Za-z]*c", arg)) and i + 1 < len(args):
                return args[i + 1]
    if prog == "runuser":  # no -c: ``runuser -u USER -- CMD ARGS`` runs the words
        i = 0
        while i < len(args) and args[i].startswith("-") and args[i] != "--":
            i += 2 if args[i] in _RUNUSER_VALUE_OPTS else 1
        words = args[i + 1 :] if i < len(args) and args[i] == "--" else args[i:]
        return words if "-u" in args[:i] or "--user" in args[:i] else None
    if prog == "parallel":
        return _parallel_command(args)
    if prog in _POSITIONAL_RUNNERS:
        i = 0
        while i < len(args) and args[i].startswith("-"):
            i += 2 if args[i] in _POSITIONAL_RUNNERS[prog] else 1
        return args[i + 1 :] or None
    return None


def _parallel_command(args: list[str]) -> str | list[str] | None:
    """What GNU ``parallel`` runs: the command before ``:::`` (with each argument put where ``{}``
    stands or after it; read once, as the words typed), or, given no command, each argument after
    ``:::`` as a command line of its own (``parallel ::: 'curl x'``)."""
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] not in (":::", "::::", ":::+"):
        i += 2 if args[i] in _PARALLEL_VALUE_OPTS else 1
    end = next((j for j in range(i, len(args)) if args[j] in (":::", "::::", ":::+", "::::+")), len(args))
    if end > i:
        return args[i:end]
    inputs = [a for a in args[end:] if a not in (":::", "::::", ":::+", "::::+")]
    return "\n".join(inputs) if end < len(args) and inputs else None


def env_split_string(words: list[str], prefix: int) -> str | None:
    """The command ``env -S 'STRING' [args]`` runs (``-S`` splits one string into a command line),
    for an ``env`` among the first ``prefix`` words (the wrappers)."""
    for i, word in enumerate(words[:prefix]):
        if posixpath.basename(word) != "env":
            continue
        j = i + 1
        while j < len(words) and words[j].startswith("-"):
            option = words[j]
            if option in ("-S", "--split-string") and j + 1 < len(words):
                return " ".join(words[j + 1 :])
            if option.startswith("--split-string="):
                return " ".join([option.split("=", 1)[1], *words[j + 1 :]])
            if re.fullmatch(r"-[iv0]*S.+", option):  # ``-S'curl x'``, ``-iScurl``
                return " ".join([option[option.index("S") + 1 :], *words[j + 1 :]])
            j += 2 if option in ("-u", "-C", "--unset", "--chdir") else 1
        return None
    return None


# ---------------------------------------------------------------------------------------------------
# Python
# ---------------------------------------------------------------------------------------------------


def python_invocation(args: list[str]) -> tuple[str, str, list[str]]:
    """What ``python args`` runs: ("code", CODE, rest), ("module", NAME, its args), ("script", FILE,
    its args) or ("stdin", "", []). Short options may be clustered (``-Im pip``, ``-Bc CODE``): ``c``,
    ``m``, ``W`` and ``X`` take the rest of the cluster, or else the next argument, as their value."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-":
            break
        if not arg.startswith("-"):
            return "script", arg, args[i + 1 :]
        if arg.startswith("--"):
            i += 1
            continue
        for at, letter in enumerate(arg[1:], start=1):
            if letter not in "cmWX":
                continue
            attached = arg[at + 1 :]
            value = attached or (args[i + 1] if i + 1 < len(args) else "")
            rest = args[i + 1 :] if attached else args[i + 2 :]
            if letter in "cm":
                return ("code" if letter == "c" else "module"), value, rest
            i += 0 if attached else 1  # -W/-X: skip their value
            break
        i += 1
    return "stdin", "", []


def python_script_file(args: list[str]) -> str | None:
    """The script ``python [options] FILE`` runs, or None (``-c``, ``-m``, stdin)."""
    kind, value, _ = python_invocation(args)
    return value if kind == "script" else None


def notebook_shell(code: str) -> Iterator[str]:
    """The shell a notebook cell runs: the body of a ``%%bash``/``%%sh``/``%%script`` cell magic,
    then each IPython ``!`` escape line."""
    stripped = code.lstrip()
    if stripped.startswith(("%%bash", "%%sh", "%%script")):
        yield stripped.partition("\n")[2]
    for line in code.splitlines():
        if line.lstrip().startswith("!"):
            yield line.lstrip()[1:]


# ---------------------------------------------------------------------------------------------------
# Files a script runs, and the shell commands of other languages' one-liners
# ---------------------------------------------------------------------------------------------------


def files_run(segments: list[Segment]) -> dict[str, str]:
    """Files the script runs: ``bash FILE``/``source FILE`` (shell), ``python FILE`` (Python), and
    ``./FILE``/``/path/FILE`` ("exec": by its shebang, else the shell), keyed by normalised path."""
    run: dict[str, str] = {}  # path -> "python", "shell" or "exec"
    for segment in segments:
        words = strip_wrappers(segment.words)
        if not words:
            continue
        prog, args = posixpath.basename(words[0]), words[1:]
        if prog in SHELLS and shell_script(args, None) is None:
            files = positional_args(args, {"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})[0]
            if files:
                run[posixpath.normpath(files[0])] = "shell"
        elif prog in ("source", ".") and args:
            run[posixpath.normpath(args[0])] = "shell"
        elif PYTHON_EXE.match(prog):
            script = python_script_file(args)
            if script:
                run[posixpath.normpath(script)] = "python"
        elif words[0].startswith(("./", "/", "../")):
            run[posixpath.normpath(words[0])] = "exec"
    return run


# awk, perl, ruby, node, php, lua code given on the command line: the shell commands it runs
# (``system("curl …")``, backticks, ``qx{…}``, ``"cmd" | getline``, ``print | "cmd"``).
EMBEDDING_PROGRAMS = wordlist("awk gawk mawk nawk busybox-awk perl ruby node nodejs php lua")
_EMBEDDED_SHELL = re.compile(
    r"\b(?:system|exec|popen|spawn|spawnSync|execSync|shell_exec|passthru|proc_open|open3|capture2e?)"
    r"\s*\(?\s*(?:\[\s*)?(['\"])((?:\\.|(?!\1).)*)\1"
    r"|\bqx\s*[{(\[/]([^})\]/]*)[})\]/]|`([^`]*)`"
    r"|(['\"])((?:\\.|(?!\5).)*)\5\s*\|\s*getline|\|\s*(['\"])((?:\\.|(?!\7).)*)\7"
)


def embedded_shell(code: str) -> Iterator[str]:
    """The shell commands an ``EMBEDDING_PROGRAMS`` one-liner's ``code`` runs, in order."""
    for match in _EMBEDDED_SHELL.finditer(code):
        yield next((g for g in match.group(2, 3, 4, 6, 8) if g is not None), "")
