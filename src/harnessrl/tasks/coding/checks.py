"""HumanEval's ``check(candidate)`` split into one pytest function per check.

A HumanEval problem's ``test`` is a module with a ``check(candidate)`` function full of asserts. A
SWE-smith-style task needs test *ids* (``FAIL_TO_PASS`` / ``PASS_TO_PASS``), so each top-level
``assert`` that involves ``candidate`` (directly or through a variable assigned from it; likewise
each loop or other compound statement, which usually asserts inside) becomes its own
``test_check_NN`` function. Statements between them (imports, helper variables) are repeated at the
top of every later test, so each test runs on its own. Asserts that do not involve ``candidate``
(HumanEval has a few ``assert True, "..."``) are left out: they can never tell a fix from no fix.

The test module imports the solution with ``from solution import *``: some checks call helpers that
the problem's prompt defines next to the function (``poly``, ``encode_cyclic``). Checks that draw
random inputs get an autouse fixture seeding ``random`` so every run tests the same inputs.
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


def split_checks(test_source: str, entry_point: str) -> SplitChecks:
    """Split HumanEval's ``test`` source into individual checks of ``entry_point``."""
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
    return SplitChecks(prelude, tests, uses_random="random" in test_source)


def render_test_module(
    split: SplitChecks, problem_id: str, entry_point: str, names: list[str] | None = None
) -> str:
    """The pytest file holding the tests named in ``names`` (all of them when ``None``)."""
    chosen = [t for t in split.tests if names is None or t.name in names]
    head = [
        f'"""Tests of `{entry_point}` in solution.py, one per check."""',
        "from solution import *  # noqa: F403  (some checks use helpers defined next to the function)",
    ]
    if split.uses_random:
        head.append("import random\n\nimport pytest")
    blocks = ["\n\n".join(head)]
    if split.uses_random:
        blocks.append(
            "@pytest.fixture(autouse=True)\ndef _same_random_inputs():\n"
            "    random.seed(0)  # the checks draw random inputs: the same ones every run"
        )
    if split.prelude:
        blocks.append(split.prelude)
    blocks += [f"def {test.name}():\n{textwrap.indent(test.body, '    ')}" for test in chosen]
    return "\n\n\n".join(blocks) + "\n"


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
