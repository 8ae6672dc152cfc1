"""The shell commands Python code runs: ``os.system``, ``subprocess``, ``pty``, ``asyncio``, ``os.exec*``.

Pure parsing, no rules: ``audit.rules`` analyses each command found as shell. Python is matched with
regular expressions, not ``ast`` (it is often a fragment: a heredoc, a notebook cell), and a command
counts only when its text is in the code: literals, literals joined with ``+``, names the same code
gives a literal, ``sys.executable`` (read as ``python``). The runners are found however the code
reaches them: under another name (``import subprocess as s``, ``f = os.system``), through the module
as an expression (``__import__('os').system``, ``getattr(os, 'system')``), libc through ctypes, or a
function of the code's own that passes one of its parameters to one (``def sh(cmd): ...``). See
docs/audit.md.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
import shlex
from collections.abc import Iterator

from harnessrl.controller.audit.shell import wordlist

# Functions that run a command line or an argv, per module (``os.exec*``'s first argument is the
# program: ``os.execvp("curl", [...])`` reads as ``curl``).
_SHELL_FUNCTIONS = {
    "os": wordlist(
        "system popen execl execle execlp execlpe execv execve execvp execvpe spawnl spawnle spawnlp"
        " spawnlpe spawnv spawnve spawnvp spawnvpe posix_spawn posix_spawnp"
    ),
    "subprocess": wordlist("run call check_call check_output Popen getoutput getstatusoutput"),
    "pty": ("spawn",),
    "asyncio": ("create_subprocess_exec", "create_subprocess_shell"),
}
# One piece of a command string: a literal, or ``sys.executable`` (the interpreter: ``python``).
_PY_PIECE = r"(?:[rbuf]{0,2}'[^'\n]*'|[rbuf]{0,2}\"[^\"\n]*\"|\bsys\.executable\b)"
# A list or tuple of them, or pieces joined with ``+`` (``"git " + "log"``, ``sys.executable + " -m pip"``),
# passed first or as ``args=``; ``os.spawn*``'s mode before it (``os.spawnlp(os.P_WAIT, "curl", …)``).
# A name among them stands for the literal the code gives it (``cmd + " -p"``, ``shlex.split(cmd)``).
_PY_NAME_PIECE = r"[A-Za-z_]\w*(?=\s*(?:[,)+]|\.split\())"
_PY_CHAIN_PIECE = rf"(?:{_PY_PIECE}|{_PY_NAME_PIECE})"
_PY_COMMAND = rf"(?:shlex\.split\(\s*)?(\[[^\]]*\]|\([^)]*\)|{_PY_CHAIN_PIECE}(?:\s*\+\s*{_PY_CHAIN_PIECE})*)"
_PY_SHELL_ARGUMENT = rf"\s*\(\s*(?:args\s*=\s*)?(?:(?:os\.)?P_[A-Z]+\s*,\s*)?{_PY_COMMAND}"
# One argument before the command in a call of a wrapper (``run(".", cmd)``): a literal, a simple
# expression, or a call without nested parentheses (``run(os.getcwd(), cmd)``).
_PY_ARGUMENT_BEFORE = (
    r"\s*(?:[rbuf]{0,2}'[^'\n]*'|[rbuf]{0,2}\"[^\"\n]*\"|[^,()'\"\[\]\n]+|[\w.]+\([^()\n]*\))\s*,"
)
# A function of the code's own that runs one of its parameters (``def sh(cmd): return
# subprocess.run(cmd, shell=True)``, ``def run(cwd, cmd): ...``) or its ``*args`` (``def git(*a):
# subprocess.run(["git", *a])`` is not one: only ``a`` itself, ``subprocess.run(a)``); its calls are
# read as the call it makes, the command found where the parameter stands or by its keyword.
_PY_DEF = re.compile(r"^([ \t]*)(?:async[ \t]+)?def[ \t]+([A-Za-z_]\w*)[ \t]*\(([^)]{0,1000})\)", re.M)
_BODY_LINE = re.compile(r"\n([ \t]*)(\S?)[^\n]*")
_MAX_COMBINATIONS = 50  # commands one call makes from names with several values
_PY_MODULE_ALIAS = re.compile(r"\bimport[ \t]+(os|subprocess|pty|asyncio)[ \t]+as[ \t]+(\w+)")
_PY_FROM_IMPORT = re.compile(r"\bfrom[ \t]+(os|subprocess|pty|asyncio)[ \t]+import[ \t]+\(?([^\n;)]+)")
_PY_STRING = re.compile(r"'([^'\n]*)'|\"([^\"\n]*)\"|\b(sys\.executable)\b")
_PY_EXECUTABLE_FIELD = re.compile(r"\{\s*sys\.executable\s*(?:![rsa])?\s*\}")  # in an f-string
# The module spelled as an expression: ``os``, ``__import__('os')``, ``importlib.import_module('os')``,
# ``sys.modules['os']`` (``{0}`` is the module's name).
_PY_MODULE_EXPRESSION = (
    r"(?:(?<![\w.]){0}|(?:importlib\.)?(?:__import__|import_module)\(\s*['\"]{0}['\"]\s*\)"
    r"|\bsys\.modules\[\s*['\"]{0}['\"]\s*\])"
)
# libc through ctypes runs a command line too: ``ctypes.CDLL(None).system(b"curl …")``, ``libc.system(…)``
# (only where the code mentions ctypes or libc, like ``audit.system``'s namespace calls).
_PY_LIBC = re.compile(r"\bctypes\b|\bc?dll\b|\blibc\b", re.I)
_PY_LIBC_CALLEE = (
    r"(?<![\w.])(?:\w+\.)*(?:(?:CDLL|LoadLibrary|PyDLL)\([^()\n]*\)|\w*libc\w*)"
    r"\.(?:system|popen|execl|execlp|execv|execvp)"
)
_MAX_VALUE = 4000  # characters of a list or tuple value read (an unclosed one is not scanned to the end)
# ``name = [...]``/``name = "..."`` with a literal value: ``cmd = ["git", "log"]; subprocess.run(cmd)``.
_PY_LITERAL_VALUE = re.compile(
    rf"^[ \t]*([A-Za-z_]\w*)[ \t]*=[ \t]*(\[[^\]]{{0,{_MAX_VALUE}}}\]|\([^)]{{0,{_MAX_VALUE}}}\)"
    rf"|{_PY_PIECE}(?:\s*\+\s*{_PY_PIECE})*)[ \t]*(?:#.*)?$",
    re.M,
)
_PY_NAME_ARGUMENT = re.compile(r"[A-Za-z_]\w*")


def _shell_callees(code: str) -> re.Pattern[str]:
    """The calls in ``code`` of the functions that run a command: ``subprocess.run``, and the same
    function under another name (``import subprocess as s`` -> ``s.run``, ``from os import system as
    sh`` -> ``sh``), reached through the module as an expression (``__import__('os').system``,
    ``getattr(os, 'system')``), or libc's ``system`` through ctypes (group 1: the command). Names
    bound to one (``f = os.system``) are ``_named_runners``'."""
    callees = []
    for module, functions in _SHELL_FUNCTIONS.items():
        expression = _PY_MODULE_EXPRESSION.format(module)
        names = "|".join(functions)
        callees.append(rf"{expression}\.(?:{names})")
        callees.append(rf"\bgetattr\(\s*{expression}\s*,\s*['\"](?:{names})['\"]\s*\)")
    for module, alias in _PY_MODULE_ALIAS.findall(code):
        callees.append(rf"(?<![\w.]){alias}\.(?:{'|'.join(_SHELL_FUNCTIONS[module])})")
    for module, names in _PY_FROM_IMPORT.findall(code):
        for item in names.split(","):
            name, _, alias = item.strip().partition(" as ")
            if name.strip() in _SHELL_FUNCTIONS[module]:
                callees.append(rf"(?<![\w.]){re.escape((alias or name).strip())}")
    if _PY_LIBC.search(code):
        callees.append(_PY_LIBC_CALLEE)
    return re.compile(rf"(?:{'|'.join(callees)}){_PY_SHELL_ARGUMENT}")


# A runner of the code's own: how its calls give the command. ``index``: the position of the argument
# that is the command (``"*"``: the call's arguments are the argv, ``sh("git", "log")``); ``keyword``:
# its parameter's name, by which a call may give it instead.
_Runner = tuple[int | str, str | None]
_PY_NAME_CALL = re.compile(r"(?<!\w)([A-Za-z_]\w*)\s*\(")
_PY_ARGV = re.compile(r"\([^)]*\)")
_PY_FIRST_COMMAND = re.compile(rf"\s*(?:args\s*=\s*)?(?:(?:os\.)?P_[A-Z]+\s*,\s*)?{_PY_COMMAND}")
_MAX_PARAMETER_INDEX = 20  # a command passed further along the parameters than this is not read


def _named_runners(code: str, callees: re.Pattern[str]) -> dict[str, _Runner]:
    """The names in ``code`` that run a command: bound to a runner (``f = os.system``, ``f =
    getattr(os, 'system')``), and the functions it defines that pass one of their parameters, or
    their ``*args`` tuple, to a runner; a wrapper of a wrapper too. Looked up by name as calls are
    met (``_command_calls``): a regular expression of thousands of names cost minutes per text."""
    runners: dict[str, _Runner] = {}
    known = callees.pattern.removesuffix(_PY_SHELL_ARGUMENT)
    for name in re.findall(rf"^[ \t]*([A-Za-z_]\w*)[ \t]*=[ \t]*{known}[ \t]*(?:#.*)?$", code, re.M):
        runners[name] = (0, None)  # f = os.system; f("curl x")
    for _ in range(2):  # a wrapper, and a wrapper of that
        runners = {**_wrappers(code, list(_command_calls(code, callees, runners))), **runners}
    return runners


def _command_calls(
    code: str, callees: re.Pattern[str], runners: dict[str, _Runner]
) -> Iterator[tuple[int, str]]:
    """``(position, argument)`` of every call in ``code`` that runs a command, in order: the text
    of the command argument (a literal, pieces joined with ``+``, a name, a list), or of the whole
    parenthesis for a ``*args`` runner (read as the argv)."""
    calls = [(m.start(), m.group(1)) for m in callees.finditer(code)]
    if runners:
        for match in _PY_NAME_CALL.finditer(code):
            runner = runners.get(match.group(1))
            if runner is not None and (argument := _runner_argument(code, match.end() - 1, runner)):
                calls.append((match.start(), argument))
        calls.sort()
    return iter(calls)


def _runner_argument(code: str, paren: int, runner: _Runner) -> str | None:
    """The command a call of ``runner`` gives, its parenthesis at ``paren``: where the parameter
    stands (``run(".", cmd)``), or after its keyword (``run(cwd=".", cmd=...)``)."""
    index, keyword = runner
    if index == "*":
        found = _PY_ARGV.match(code, paren)
        return found.group(0) if found else None
    found = _argument_at(int(index)).match(code, paren + 1)
    if found is None and keyword is not None:
        found = _keyword_argument(keyword).match(code, paren + 1)
    return found.group(1) if found else None


@functools.lru_cache(maxsize=64)
def _argument_at(index: int) -> re.Pattern[str]:
    if index == 0:
        return _PY_FIRST_COMMAND
    return re.compile(rf"(?:{_PY_ARGUMENT_BEFORE}){{{index}}}\s*{_PY_COMMAND}")


@functools.lru_cache(maxsize=1024)
def _keyword_argument(keyword: str) -> re.Pattern[str]:
    # Up to the parenthesis that closes the call (one level of nested calls skipped).
    return re.compile(rf"(?:[^()]|\([^()]*\))*?(?<![\w.]){re.escape(keyword)}\s*=\s*{_PY_COMMAND}")


def _wrappers(code: str, calls: list[tuple[int, str]]) -> dict[str, _Runner]:
    """Functions defined in ``code`` that pass one of their parameters, or their ``*args`` tuple, to
    one of ``calls`` (sorted by position)."""
    calls = [(at, arg) for at, arg in calls if arg and _PY_NAME_ARGUMENT.fullmatch(arg)]
    if not calls:
        return {}
    positions = [at for at, _ in calls]
    found: dict[str, _Runner] = {}
    for match in _PY_DEF.finditer(code):
        indent = len(match.group(1).expandtabs())
        end = len(code)
        for line in _BODY_LINE.finditer(code, match.end()):  # the body: the lines indented deeper
            if line.group(2) and len(line.group(1).expandtabs()) <= indent:
                end = line.start()
                break
        params = [p.strip().split(":")[0].split("=")[0].strip() for p in match.group(3).split(",")]
        params = [p for p in params if p and p not in ("self", "cls", "/")]
        # Parameters that can be given by position: before any ``*``/``*args``.
        positional = list(itertools.takewhile(lambda p: not p.startswith("*"), params))
        star = next((p[1:] for p in params if p.startswith("*") and not p.startswith("**")), None)
        for _, arg in calls[bisect.bisect_left(positions, match.end()) : bisect.bisect_left(positions, end)]:
            if arg in positional and positional.index(arg) <= _MAX_PARAMETER_INDEX:
                found.setdefault(match.group(2), (positional.index(arg), arg))
            elif arg == star:
                found.setdefault(match.group(2), ("*", None))
    return found


def python_shell_calls(code: str) -> Iterator[str]:
    """The shell commands Python code runs with literal arguments: ``os.system("curl ...")``,
    ``subprocess.run(["pip", ...])`` (a list is joined back into one command line), the same
    functions imported under other names or reached another way (``_shell_callees``),
    ``os.execvp("curl", …)``, ``pty.spawn([...])``. Literals joined with ``+`` are one string
    (``os.system("git " + "log")``), ``sys.executable``, also in an f-string, is ``python``
    (``subprocess.run([sys.executable, "-m", "pip", "install", x])``, how Python code usually installs
    a package), and a name given a literal in the same code is its value (``cmd = ["git", "log"];
    subprocess.run(cmd)``; every value the name is given, whichever branch holds it)."""
    values: dict[str, list[str]] = {}
    for name, value in _PY_LITERAL_VALUE.findall(code):
        values.setdefault(name, []).append(value)
    for name in values:
        values[name] = list(dict.fromkeys(values[name]))
    seen: set[str] = set()  # each command once: ``subprocess.run(cmd)`` 1,000 times is one command
    names_read: set[str] = set()
    callees = _shell_callees(code)
    for _, argument in _command_calls(code, callees, _named_runners(code, callees)):
        if _PY_NAME_ARGUMENT.fullmatch(argument):
            if argument in names_read:
                continue
            names_read.add(argument)  # a name's values are read once, however often it is run
            arguments = values.get(argument, [])
        elif argument.startswith(("[", "(")):
            arguments = [argument]
        else:  # pieces joined with ``+``, names among them put in
            arguments = list(_joined(argument, values))
        for arg in arguments:
            strings = [
                "python" if exe else _PY_EXECUTABLE_FIELD.sub("python", a or b)
                for a, b, exe in _PY_STRING.findall(arg)
            ]
            command = shlex.join(strings) if arg.startswith(("[", "(")) else "".join(strings)
            if command not in seen:
                seen.add(command)
                yield command
    for argv in _exec_argvs(code):
        if argv not in seen:
            seen.add(argv)
            yield argv


# ``os.execvp("git", ["git", "log"])``, ``os.execl("/usr/bin/git", "git", "log")``, ``os.spawnlp(os.P_WAIT,
# "curl", "curl", url)``: after the program, the argv it runs (the program alone reads as ``git``).
_PY_EXEC_ARGV = re.compile(r"\b(?:exec|spawn)(?:v|vp|ve|vpe|l|lp|le|lpe)\s*\(([^)\n]{0,2000})")


def _exec_argvs(code: str) -> Iterator[str]:
    """The command lines of the ``exec*``/``spawn*`` calls in ``code`` whose argv is literal."""
    for call in _PY_EXEC_ARGV.finditer(code):
        strings = [a or b for a, b, _ in _PY_STRING.findall(call.group(1))]
        if len(strings) > 1:
            yield shlex.join(strings[1:])


_PY_CHAIN_TOKEN = re.compile(rf"{_PY_PIECE}|[A-Za-z_]\w*")


def _joined(chain: str, values: dict[str, list[str]]) -> Iterator[str]:
    """The strings ``"a" + name + "b"`` can be, each name one of its literal string values (at most
    ``_MAX_COMBINATIONS``; a name with none is left out)."""
    options: list[list[str]] = []
    for token in _PY_CHAIN_TOKEN.findall(chain):
        if token.endswith(("'", '"')) or token == "sys.executable":
            options.append([token])
        else:
            options.append([v for v in values.get(token, []) if not v.startswith(("[", "("))] or [""])
    for count, combination in enumerate(itertools.product(*options)):
        if count == _MAX_COMBINATIONS:
            return
        yield " + ".join(combination)
