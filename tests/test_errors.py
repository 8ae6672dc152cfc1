"""Errors name what happened; only the gateway knows HTTP statuses (``gateway.errors.ERROR_SHAPES``).

An AST check over the source: no module outside ``harnessrl/gateway/`` defines or reads
``http_status`` or ``error_type`` (as an attribute, a name, a keyword or a ``getattr`` string), and
the error classes in ``harnessrl/errors.py`` set no class attribute at all beyond their docstring.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "harnessrl"
HTTP_WORDS = frozenset({"http_status", "error_type"})


def _http_uses(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            word = node.attr
        elif isinstance(node, ast.Name):
            word = node.id
        elif isinstance(node, ast.keyword):
            word = node.arg or ""
        elif isinstance(node, ast.arg):
            word = node.arg
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            word = node.value
        else:
            continue
        if word in HTTP_WORDS:
            found.append((getattr(node, "lineno", 0), word))
    return found


def test_only_the_gateway_speaks_http_status() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if (SRC / "gateway") in path.parents:
            continue
        for line, word in _http_uses(ast.parse(path.read_text(encoding="utf-8"))):
            offenders.append(f"{path.relative_to(SRC.parent)}:{line}: {word}")
    assert not offenders, "HTTP mapping outside the gateway (use gateway.errors.ERROR_SHAPES):\n" + "\n".join(
        offenders
    )


def test_error_classes_carry_no_mapping() -> None:
    tree = ast.parse((SRC / "errors.py").read_text(encoding="utf-8"))
    for cls in (node for node in tree.body if isinstance(node, ast.ClassDef)):
        for stmt in cls.body:
            is_docstring = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            assert is_docstring or isinstance(stmt, ast.FunctionDef), (
                f"errors.py:{stmt.lineno}: {cls.name} sets a class attribute; statuses, types and codes "
                "belong in gateway.errors.ERROR_SHAPES"
            )


def test_the_checker_sees_each_form() -> None:
    code = (
        "class E(Exception):\n    http_status = 400\n"
        "x = exc.http_status\ny = getattr(exc, 'error_type', None)\nf(error_type='a')\n"
    )
    assert sorted(_http_uses(ast.parse(code))) == [
        (2, "http_status"),
        (3, "http_status"),
        (4, "error_type"),
        (5, "error_type"),
    ]
