"""HumanEval's ``check(candidate)`` split into one pytest function per check.

A HumanEval problem's ``test`` is a module with a ``check(candidate)`` function full of asserts. A
SWE-smith-style task needs test *ids* (``FAIL_TO_PASS`` / ``PASS_TO_PASS``), so each top-level
``assert`` that involves ``candidate`` (directly or through a variable assigned from it; likewise
each loop or other compound statement, which usually asserts inside) becomes its own
``test_check_NN`` function. Statements between them (imports, helper variables) are repeated at the
top of every later test, so each test runs on its own. Asserts that do not involve ``candidate``
(HumanEval has a few ``assert True, "..."``) are left out: they can never tell a fix from no fix.

The test module takes nothing from ``solution.py`` but the function under test
(``from solution import f``): solution.py is the policy's, and a check that looked a name up there
(``range``, ``abs``, the prompt's helpers) would be judged by it. Helpers the checks call that the
problem's prompt defines next to the function (``poly``, ``encode_cyclic``) are a trusted copy of the
prompt's code, in the test module itself. Everything else the module needs is bound *before*
solution.py runs (``render_test_module`` says how), and every call of the function must return plain
data. Checks that draw random inputs get an autouse fixture seeding ``random`` so every run tests
the same inputs.
"""

from __future__ import annotations

import ast
import copy
import textwrap
from dataclasses import dataclass

TEST_FILE = "tests/test_solution.py"
SOLUTION_FILE = "solution.py"
_CHECKS = (ast.Assert, ast.For, ast.While, ast.If, ast.With, ast.Try)


@dataclass(frozen=True)
class CheckTest:
    name: str  # test function name, e.g. test_check_03
    body: str  # the function's body, dedented (setup statements, then the check)
    check: str  # the check statement alone, with `candidate` spelled as the function's name
    call: str | None = None  # for `assert candidate(...) == expected`: the call, readable
    expected: str | None = None  # ... and the expected value's source
    probe: str | None = None  # ... and a `__probe__()` function returning what the call returns

    @property
    def test_id(self) -> str:
        return f"{TEST_FILE}::{self.name}"


@dataclass(frozen=True)
class SplitChecks:
    prelude: str  # the test module's other top-level code (METADATA = ..., imports)
    tests: list[CheckTest]
    uses_random: bool
    entry_point: str  # the function under test: the one name taken from solution.py
    helpers: str = ""  # the prompt's code besides the function, when the checks call into it: trusted


def split_checks(test_source: str, entry_point: str, prompt: str = "") -> SplitChecks:
    """Split HumanEval's ``test`` source into individual checks of ``entry_point``. ``prompt`` is the
    problem's prompt: the helpers it defines next to the function, if the checks use them, are kept
    (``SplitChecks.helpers``) so that the tests never take them from solution.py."""
    module = ast.parse(test_source)
    check = next((n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if check is None:
        raise ValueError("the test source has no check(candidate) function")
    prelude = "\n".join(_segment(test_source, node) for node in module.body if node is not check).strip()
    setup: list[str] = []
    tests: list[CheckTest] = []
    depends = {"candidate"}  # names whose value comes from the function under test
    for stmt in check.body:
        text = _segment(test_source, stmt)
        if not isinstance(stmt, _CHECKS):
            setup.append(text)
            if _mentions(stmt, depends):  # `y = candidate(3)`: a later `assert y == 9` tests it
                depends |= {
                    n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                }
            continue
        if not _mentions(stmt, depends):
            continue  # `assert True, "..."`: passes whatever the code does
        name = f"test_check_{len(tests):02d}"
        body = "\n".join([f"candidate = {entry_point}", *setup, text])
        call = _checked_call(stmt)
        extra = {}
        if call is not None:
            probe_body = "\n".join([f"candidate = {entry_point}", *setup, f"return {ast.unparse(call.left)}"])
            extra = {
                "call": _readable(call.left, entry_point),
                "expected": ast.unparse(call.comparators[0]),
                "probe": f"def __probe__():\n{textwrap.indent(probe_body, '    ')}\n",
            }
        tests.append(CheckTest(name, body, _readable(stmt, entry_point), **extra))
    if not tests:
        raise ValueError("check() has no assert that calls candidate")
    return SplitChecks(
        prelude,
        tests,
        uses_random="random" in test_source,
        entry_point=entry_point,
        helpers=_prompt_helpers(prompt, entry_point, module),
    )


def _prompt_helpers(prompt: str, entry_point: str, test: ast.Module) -> str:
    """The prompt's top-level code other than ``entry_point``'s definition (its imports and helper
    functions), when the checks in ``test`` use a name it defines; else ``""``."""
    if not prompt.strip():
        return ""
    rest = [
        node
        for node in ast.parse(prompt).body
        if not (isinstance(node, ast.FunctionDef) and node.name == entry_point)
    ]
    used = {n.id for n in ast.walk(test) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    if not any(_defines(node) & used for node in rest):
        return ""
    return "\n\n\n".join(_segment(prompt, node).strip() for node in rest)


def _defines(node: ast.stmt) -> set[str]:
    """Names a top-level statement of the prompt defines (its imports serve its own helpers)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Import | ast.ImportFrom):
        return set()
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def render_test_module(
    split: SplitChecks, problem_id: str, entry_point: str, names: list[str] | None = None
) -> str:
    """The pytest file holding the tests named in ``names`` (all of them when ``None``).

    In order: the imports of every module the checks, prelude and helpers use; the guard (``_GUARD``),
    which copies the builtins and snapshots those modules; the random-seeding fixture; the prelude; the
    prompt's helpers; and only then ``from solution import <entry_point>``, the one line that runs
    solution.py, followed by the tests."""
    chosen = [t for t in split.tests if names is None or t.name in names]
    modules = sorted({"builtins", "sys", *(["random"] if split.uses_random else []), *_imported(split)})
    head = [
        f'"""Tests of `{entry_point}` in solution.py, one per check."""',
        "\n".join(f"import {m}" for m in modules) + ("\n\nimport pytest" if split.uses_random else ""),
        _GUARD.replace("<MODULES>", repr(tuple(m for m in modules if m != "sys"))),
    ]
    blocks = ["\n\n".join(head)]
    if split.uses_random:
        blocks.append(
            "@pytest.fixture(autouse=True)\ndef _same_random_inputs():\n"
            "    random.seed(0)  # the checks draw random inputs: the same ones every run"
        )
    blocks += [code for code in (split.prelude, split.helpers) if code]
    blocks.append(
        f"from solution import {entry_point}  # the function under test: nothing else from solution.py\n\n"
        f"{entry_point} = _checked({entry_point})\n_untouched()"
    )
    blocks += [f"def {test.name}():\n{textwrap.indent(test.body, '    ')}" for test in chosen]
    return "\n\n\n".join(blocks) + "\n"


def _imported(split: SplitChecks) -> set[str]:
    """The absolute imports in the checks, the prelude and the helpers: modules the tests use."""
    found: set[str] = set()
    for code in [split.prelude, split.helpers, *(t.body for t in split.tests)]:
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module)
    return found


# Between a test module's imports and its tests. solution.py runs later, when the module imports the
# function under test, in this same process: what it could shadow (``from solution import *`` handed
# it ``range`` and ``abs``) or replace (``builtins.abs = ...``, ``random.Random._randbelow = ...``) is
# copied or snapshotted here first, and checked after every call of the function.
_GUARD = '''\
# Taken before solution.py runs. Functions defined from here on look builtins up in this copy, so that
# code can neither shadow nor replace one for them; `_untouched` tells whether it changed a module the
# checks use (or a class or object in one); what the function under test returns must be plain data.
__builtins__ = dict(vars(builtins))
_PLAIN = (type(None), bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset)
_GONE = object()


def _namespaces():
    found = []
    for name in <MODULES>:
        module = sys.modules[name]
        found.append((module, dict(vars(module))))
        for key, value in vars(module).items():
            builtin_type = isinstance(value, type) and value.__flags__ & 256  # Py_TPFLAGS_IMMUTABLETYPE
            if key.startswith("__") or builtin_type or type(value) is type(sys):
                continue
            if hasattr(value, "__dict__"):
                found.append((value, dict(vars(value))))
    return found


_BEFORE = _namespaces()


def _untouched():
    now = _namespaces()
    same = len(now) == len(_BEFORE) and all(
        owner is was and len(names) == len(before) and all(names.get(k, _GONE) is v for k, v in before.items())
        for (owner, names), (was, before) in zip(now, _BEFORE)
    )
    if not same:
        raise RuntimeError("the code under test changed a module the checks use, or a class or object in one")


def _plain(value):
    """Exactly these types all the way down: no subclass, whose == could say anything."""
    todo, seen = [value], set()
    while todo:
        item = todo.pop()
        kind = type(item)
        if not any(kind is plain for plain in _PLAIN):  # `is`: a metaclass may redefine == on types
            return False
        if kind in (list, tuple, dict, set, frozenset) and id(item) not in seen:
            seen.add(id(item))
            todo.extend(item.keys() if kind is dict else item)
            todo.extend(item.values() if kind is dict else ())
    return True


def _checked(function):
    def checked(*args, **kwargs):
        value = function(*args, **kwargs)
        _untouched()
        if not _plain(value):
            raise TypeError(f"the function under test returned a {type(value).__name__}, not plain data")
        return value

    return checked'''


def _segment(source: str, node: ast.AST) -> str:
    """The statement's source text, dedented (continuation lines keep their relative indent)."""
    text = ast.get_source_segment(source, node, padded=True)
    assert text is not None
    return textwrap.dedent(text)


def _mentions(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name(self.new, node.ctx) if node.id == self.old else node


def _readable(node: ast.AST, entry_point: str) -> str:
    """The node's code with ``candidate`` spelled as the function's own name (for problem statements)."""
    return ast.unparse(_Rename("candidate", entry_point).visit(copy.deepcopy(node)))


def _checked_call(stmt: ast.stmt) -> ast.Compare | None:
    """``assert candidate(...) == expected`` -> its Compare node (the shape most HumanEval checks have)."""
    if not isinstance(stmt, ast.Assert) or not isinstance(stmt.test, ast.Compare):
        return None
    test = stmt.test
    left = test.left
    if (
        len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
        and isinstance(left, ast.Call)
        and isinstance(left.func, ast.Name)
        and left.func.id == "candidate"
    ):
        return test
    return None
