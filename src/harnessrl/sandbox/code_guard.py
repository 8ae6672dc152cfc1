"""No code from untrusted text: an audit hook that lets a process compile only code it can vouch for.

Some scorers parse an answer by running it: reasoning-gym's string_insertion does ``eval(answer)`` to
read a Python list, countdown ``sympy.parse_expr(answer)`` (which turns the text into Python and
``eval``\\ s it). A sandbox around that process keeps the code away from everything outside it, but not
from the process itself, and the process is what writes the verdict: code in an answer could write
``{"score": 1.0}`` to the result pipe, or read the gold answer out of the scorer's frame
(``eval("entry['answer']")``). So the scoring process must not run code the answer wrote at all.

``forbid_untrusted_code`` installs a ``sys.addaudithook`` hook (hooks cannot be removed) that refuses,
with ``UntrustedCodeError``, every ``compile`` (``eval``, ``exec`` and ``compile`` of text or of an
AST, what ``parse_expr`` does) of source that is not

- one of the ``trusted`` strings, verbatim (what the dataset generated: an entry's own expression,
  which some scorers ``eval``), or sympy's own ``from sympy import *`` (``parse_expr`` runs it);
- a file that exists (a module imported from source);
- a **plain expression**: literals, containers, arithmetic and comparison operators, calls of the
  names in ``calls`` (sympy's constructors and math functions) with keyword arguments, and as other
  names only math constants and one-letter variables (``parse_expr`` leaves the caller's symbols,
  ``x`` or ``C``, as names); no attribute access, subscripts, lambdas, comprehensions, f-strings or
  ``**kwargs``. That is exactly what reading a list literal or a math answer needs, and none of it
  can reach anything but the values it builds: not a scorer's local variables (``eval(answer)``
  without namespaces sees the scorer's frame, where ``oracle_answer`` is), not a module, not a
  file. ``7**(2*7**8)`` is allowed: the sandbox's CPU limit ends it.

It also refuses unpickling (``pickle.find_class``), starting processes, sockets, ``ctypes`` and
opening files for writing: none of which a scorer does, all of which code that got past the first
rule would. Where a scorer compiles something else (a ``namedtuple`` made per call), it fails
closed: the answer scores as if it could not be parsed.

Install it after the process has finished its own setup (it refuses ``ctypes`` from then on).
"""

from __future__ import annotations

import ast
import os
import sys
import threading
from collections.abc import Iterable

# Callables a plain expression may call: what sympy's parse_expr emits for numbers, symbols and
# undefined functions, and the usual math functions (names only: the values are sympy's or Python's).
MATH_CALLS: frozenset[str] = frozenset(
    {
        *("Symbol", "Symbols", "Function", "Integer", "Float", "Rational", "Number", "Add", "Mul", "Pow"),
        *("factorial", "factorial2", "binomial", "gamma", "sqrt", "cbrt", "root", "exp", "log", "ln"),
        *("sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "atan2", "acot", "asec"),
        *("acsc", "sinh", "cosh", "tanh", "coth", "sech", "csch", "asinh", "acosh", "atanh", "acoth"),
        *("Abs", "sign", "floor", "ceiling", "Max", "Min", "re", "im", "conjugate", "arg", "Eq"),
        *("abs", "min", "max", "round", "int", "float", "complex"),
    }
)

# Names a plain expression may use as values (besides the callables and one-letter variables).
MATH_CONSTANTS: frozenset[str] = frozenset(
    {"pi", "E", "I", "oo", "zoo", "nan", "EulerGamma", "GoldenRatio", "Catalan", "true", "false"}
)
# Code sympy itself compiles on every parse_expr (its default namespace).
_LIBRARY_SOURCES = frozenset({"from sympy import *"})

# Audit events refused outright: none is part of scoring, all are what escaped code would do next.
_REFUSED_EVENTS = frozenset(
    {
        *("pickle.find_class", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork"),
        *("os.forkpty", "os.kill", "os.killpg", "subprocess.Popen", "socket.__new__", "socket.connect"),
        *("socket.bind", "socket.sendto", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata"),
        *("ctypes.call_function", "ctypes.addressof", "ctypes.string_at", "ctypes.wstring_at"),
        *("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink"),
        *("os.link", "os.truncate", "shutil.rmtree", "sys.remote_exec"),
    }
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

_PLAIN_NODES = (
    ast.Expression,
    ast.Constant,
    ast.List,
    ast.Tuple,
    ast.Set,
    ast.Dict,
    ast.UnaryOp,
    ast.BinOp,
    ast.BoolOp,
    ast.Compare,
    ast.IfExp,
    ast.Name,
    ast.Load,
    ast.operator,
    ast.unaryop,
    ast.boolop,
    ast.cmpop,
)


class UntrustedCodeError(RuntimeError):
    """Refused by ``forbid_untrusted_code``: the process tried to run code it cannot vouch for."""


def is_plain_expression(tree: ast.AST, calls: frozenset[str] = MATH_CALLS) -> bool:
    """Whether ``tree`` (an ``ast.Expression``) is built only of what a plain expression may hold."""
    if not isinstance(tree, ast.Expression):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if not _allowed_callee(node.func, calls):
                return False
            if any(kw.arg is None or kw.arg.startswith("_") for kw in node.keywords):
                return False
        elif isinstance(node, ast.keyword):
            continue
        elif not isinstance(node, _PLAIN_NODES):
            return False
        if isinstance(node, ast.Name) and not _allowed_name(node.id, calls):
            return False
    return True


def _allowed_name(name: str, calls: frozenset[str]) -> bool:
    return name in calls or name in MATH_CONSTANTS or (len(name) == 1 and name.isascii() and name.isalpha())


def _allowed_callee(func: ast.expr, calls: frozenset[str]) -> bool:
    if isinstance(func, ast.Name):
        return func.id in calls
    # sympy's undefined functions: Function('f')(x)
    return (
        isinstance(func, ast.Call)
        and isinstance(func.func, ast.Name)
        and func.func.id == "Function"
        and len(func.args) == 1
        and isinstance(func.args[0], ast.Constant)
        and not func.keywords
    )


def forbid_untrusted_code(trusted: Iterable[str] = (), calls: frozenset[str] = MATH_CALLS) -> None:
    """From now on, this process compiles only trusted strings, files and plain expressions."""
    vouched = frozenset(trusted) | _LIBRARY_SOURCES
    parsing = threading.local()  # our own ast.parse inside the hook compiles too

    def allowed(source: object) -> bool:
        if isinstance(source, ast.AST):
            return is_plain_expression(source, calls)
        if isinstance(source, bytes | bytearray | memoryview):  # eval("...") compiles its bytes
            try:
                source = bytes(source).decode()
            except UnicodeDecodeError:
                return False
        if not isinstance(source, str):
            return False
        if source in vouched:
            return True
        parsing.active = True
        try:
            tree = ast.parse(source, mode="eval")
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            return False
        finally:
            parsing.active = False
        return is_plain_expression(tree, calls)

    def hook(event: str, args: tuple) -> None:
        if event == "compile":
            if getattr(parsing, "active", False):
                return
            source, filename = args[0], args[1]
            if isinstance(filename, str) and os.path.isabs(filename) and os.path.isfile(filename):
                return
            if not allowed(source):
                raise UntrustedCodeError("refused to compile code that is not a plain expression")
        elif event == "open":
            mode, flags = args[1], args[2]
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS
            ):
                raise UntrustedCodeError("refused to open a file for writing")
        elif event in _REFUSED_EVENTS:
            raise UntrustedCodeError(f"refused {event}")

    sys.addaudithook(hook)
