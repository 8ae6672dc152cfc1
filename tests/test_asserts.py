"""``assert`` is for invariants, never for input (shared/STYLE.md, "Errors"): ``python -O`` removes
it, and a user who trips one gets a bare ``AssertionError`` instead of a message naming the field.

Every ``assert`` statement under ``src/harnessrl`` is parsed with ``ast``. Narrowing the type of a
local name or of the object's own attribute for the checker (``x is not None``, ``self._x is not
None``, ``isinstance(x, T)``) states what the code itself guarantees and passes; any other assert
must be listed below with the invariant it states. Input (a config field, a request, a file, argv)
is checked with ``ConfigError`` / ``BadRequest`` and their kin instead: the task sources' ``assert
source.dataset is not None`` on a ``[tasks]`` field was one, and is what the narrowing rule refuses
(an attribute of another object).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

#: (file under src/, the assert's condition as ``ast.unparse`` writes it): the invariant it states.
INVARIANTS = {
    ("harnessrl/gateway/workers.py", "gateway.admin_key"): "run_gateway sets it before starting workers",
    ("harnessrl/engines/chat_templates/__init__.py", "_DEFAULT_LINE in text"): "a file of the package",
    ("harnessrl/store/codecs.py", "array('i').itemsize == 4 and array('d').itemsize == 8"): "the platform",
    (
        "harnessrl/store/migrations.py",
        "[m.version for m in MIGRATIONS] == list(range(1, SCHEMA_VERSION + 1))",
    ): "the migration table",
    ("harnessrl/controller/kubernetes/names.py", "is_dns1123_label(name)"): "names are built, not read",
    ("harnessrl/ascii_splits.py", "self._matches.groups == 0"): "patterns come from the module's own table",
    ("harnessrl/environments/store.py", "recipe.containerfile is not None"): "ImageRecipe validates one kind",
    ("harnessrl/environments/store.py", "recipe.debian is not None"): "the caller matched the kind",
    (
        "harnessrl/sandbox/seccomp.py",
        "not set(ALLOWED_SYSCALLS) & set(DENIED_SYSCALLS)",
    ): "the module's tables",
    ("harnessrl/tasks/coding/probes.py", "probe.expected is not None"): "callers pass the recorded probes",
    (
        "harnessrl/retrieval/sandbox_tools/search_mcp.py",
        "spec is not None and spec.loader is not None",
    ): "the module's own sibling file",
    (
        "harnessrl/gateway/pipeline/driver.py",
        "parsed.prompt_ids is not None",
    ): "the request parser sets messages or prompt IDs, never neither",
    (
        "harnessrl/gateway/pipeline/generation.py",
        "not self.stop",
    ): "only generations run without stop strings are replayed",
    (
        "harnessrl/gateway/teacher/chat.py",
        "message.finish_reason is not None",
    ): "ChatStream raises on an upstream stream that ended without a finish reason",
}


def own(target: ast.expr) -> bool:
    """A local name or an attribute of ``self``: state the code holds, not data it was handed."""
    if isinstance(target, ast.Name):
        return True
    return (
        isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
    )


def narrows_a_type(test: ast.expr) -> bool:
    """``x is not None``, ``isinstance(x, T)`` or ``not isinstance(x, T)`` of an ``own`` target, or
    several of them joined by ``and``."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return all(narrows_a_type(value) for value in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test = test.operand
    if isinstance(test, ast.Compare):
        return (
            len(test.ops) == 1
            and isinstance(test.ops[0], ast.IsNot)
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value is None
            and own(test.left)
        )
    return (
        isinstance(test, ast.Call)
        and isinstance(test.func, ast.Name)
        and test.func.id == "isinstance"
        and own(test.args[0])
    )


def asserts() -> list[tuple[str, int, str, ast.expr]]:
    found = []
    for path in sorted((SRC / "harnessrl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Assert):
                found.append(
                    (path.relative_to(SRC).as_posix(), node.lineno, ast.unparse(node.test), node.test)
                )
    return found


def test_every_assert_in_src_states_an_invariant():
    unexplained = [
        f"src/{path}:{line}: assert {condition}"
        for path, line, condition, test in asserts()
        if not narrows_a_type(test) and (path, condition) not in INVARIANTS
    ]
    assert not unexplained, (
        "an assert that is not a type narrowing: raise ConfigError/BadRequest if it checks input, "
        "or list it in INVARIANTS with the invariant it states:\n" + "\n".join(unexplained)
    )


def test_the_check_sees_an_input_assert():
    # Control: the assert that once checked [tasks] dataset is refused; narrowing own state is not.
    def test_of(line: str) -> ast.expr:
        return ast.parse(line).body[0].test

    assert not narrows_a_type(test_of("assert source.dataset is not None"))
    assert not narrows_a_type(test_of("assert config.path"))
    assert narrows_a_type(test_of("assert self._root is not None"))
    assert narrows_a_type(test_of("assert isinstance(exc, HarnessRLError)"))
