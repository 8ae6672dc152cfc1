"""Deterministic bug injection: small, source-preserving mutations of one Python function.

A *mutant* changes one spot of the function's body and nothing else: the edit is spliced into the
original text (comments, quotes and layout stay as they were, so ``git diff`` shows a one-token
change), and every mutant is checked by re-parsing: its syntax tree must equal the original tree with
exactly the intended change applied. Mutants that fail that check are dropped, never guessed at.

Operators (the names appear in the build report and in each task's hidden ``mutation.json``):

| operator | change |
|---|---|
| ``flip_comparison`` | ``<``↔``<=``, ``>``↔``>=``, ``==``↔``!=``, ``in``↔``not in``, ``is``↔``is not`` |
| ``swap_arithmetic`` | ``+``↔``-``, ``*``↔``/``, ``%``↔``//`` (also in ``+=``, ``-=``, ...) |
| ``off_by_one`` | an integer literal ``n`` → ``n - 1`` (``n + 1`` for 0 and after a unary minus) |
| ``shorten_range`` | ``range(..., stop)`` → ``range(..., stop - 1)`` |
| ``swap_boolean`` | ``and``↔``or`` |
| ``negate_condition`` | ``if c`` → ``if not c`` (and ``if not c`` → ``if c``; also ``x if c else y``) |
| ``flip_bool_constant`` | ``True``↔``False`` |

Which mutants actually break the function is decided by running its tests (``screen``), not here.
"""

from __future__ import annotations

import ast
import copy
import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

OPERATORS = (
    "flip_comparison",
    "swap_arithmetic",
    "off_by_one",
    "shorten_range",
    "swap_boolean",
    "negate_condition",
    "flip_bool_constant",
)


@dataclass(frozen=True)
class Mutant:
    """One injected bug: ``source`` is the whole module with the change applied."""

    operator: str
    line: int  # 1-based line of the change in the module
    before: str  # the text that was replaced
    after: str  # the text put in its place
    source: str

    @property
    def description(self) -> str:
        return f"line {self.line}: `{self.before}` -> `{self.after}`"


# (original op class, replacement op class, regex finding the original's token between operands)
_COMPARE_FLIPS: dict[type[ast.cmpop], tuple[type[ast.cmpop], str, str]] = {
    ast.Lt: (ast.LtE, r"<(?!=)", "<="),
    ast.LtE: (ast.Lt, r"<=", "<"),
    ast.Gt: (ast.GtE, r">(?!=)", ">="),
    ast.GtE: (ast.Gt, r">=", ">"),
    ast.Eq: (ast.NotEq, r"==", "!="),
    ast.NotEq: (ast.Eq, r"!=", "=="),
    ast.NotIn: (ast.In, r"\bnot\s+in\b", "in"),
    ast.In: (ast.NotIn, r"\bin\b", "not in"),
    ast.IsNot: (ast.Is, r"\bis\s+not\b", "is"),
    ast.Is: (ast.IsNot, r"\bis\b", "is not"),
}
_ARITH_SWAPS: dict[type[ast.operator], tuple[type[ast.operator], str, str]] = {
    ast.Add: (ast.Sub, r"\+", "-"),
    ast.Sub: (ast.Add, r"-", "+"),
    ast.Mult: (ast.Div, r"(?<!\*)\*(?!\*)", "/"),
    ast.Div: (ast.Mult, r"(?<!/)/(?!/)", "*"),
    ast.Mod: (ast.FloorDiv, r"%", "//"),
    ast.FloorDiv: (ast.Mod, r"//", "%"),
}
_BOOL_SWAPS: dict[type[ast.boolop], tuple[type[ast.boolop], str, str]] = {
    ast.And: (ast.Or, r"\band\b", "or"),
    ast.Or: (ast.And, r"\bor\b", "and"),
}
# Expressions that read fine after a bare ``not `` or before `` - 1`` without parentheses.
_ATOMS = (ast.Name, ast.Call, ast.Attribute, ast.Subscript)


@dataclass(frozen=True)
class _Edit:
    start: tuple[int, int]  # (lineno, col_offset): ast positions, col in UTF-8 bytes
    end: tuple[int, int]
    text: str


@dataclass(frozen=True)
class _Site:
    operator: str
    node_index: int  # index in ast.walk order: the same node in a deep copy of the tree
    edits: tuple[_Edit, ...]
    apply: Callable[[ast.AST], None]  # the intended change, applied to the copy's node


def mutants(source: str, function: str) -> list[Mutant]:
    """Every verified single-spot mutant of ``function``'s body in ``source``, in source order."""
    tree = ast.parse(source)
    target = next(
        (
            n
            for n in tree.body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == function
        ),
        None,
    )
    if target is None:
        raise ValueError(f"no top-level function {function!r} in the source")
    nodes = list(ast.walk(tree))
    index = {id(node): i for i, node in enumerate(nodes)}
    parents = {id(child): node for node in nodes for child in ast.iter_child_nodes(node)}
    body = target.body[1:] if ast.get_docstring(target) is not None else target.body
    inside = {id(n) for stmt in body for n in ast.walk(stmt)}
    lines = source.encode().splitlines(keepends=True)

    sites: list[_Site] = []
    for node in nodes:
        if id(node) in inside:
            sites.extend(_sites_of(node, index[id(node)], parents.get(id(node)), lines))
    sites.sort(key=lambda s: (s.edits[0].start, OPERATORS.index(s.operator)))

    out: list[Mutant] = []
    for site in sites:
        mutant = _realize(source, tree, lines, site)
        if mutant is not None:
            out.append(mutant)
    return out


def _sites_of(node: ast.AST, i: int, parent: ast.AST | None, lines: list[bytes]) -> Iterator[_Site]:
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        for k, op in enumerate(node.ops):
            flip = _COMPARE_FLIPS.get(type(op))
            edit = flip and _token_edit(lines, operands[k], operands[k + 1], flip[1], flip[2])
            if flip and edit:
                yield _Site("flip_comparison", i, (edit,), _set_item("ops", k, flip[0]))
    elif isinstance(node, ast.BinOp | ast.AugAssign):
        swap = _ARITH_SWAPS.get(type(node.op))
        left = node.left if isinstance(node, ast.BinOp) else node.target
        right = node.right if isinstance(node, ast.BinOp) else node.value
        edit = swap and _token_edit(lines, left, right, swap[1], swap[2])
        if swap and edit:
            yield _Site("swap_arithmetic", i, (edit,), _set_attr("op", swap[0]))
    elif isinstance(node, ast.BoolOp):
        swap = _BOOL_SWAPS[type(node.op)]
        edits = [_token_edit(lines, a, b, swap[1], swap[2]) for a, b in itertools.pairwise(node.values)]
        if all(edits):
            if isinstance(parent, ast.BoolOp):  # keep the grouping: `x or (a and b)`
                edits = [_Edit(_start(node), _start(node), "("), *edits, _Edit(_end(node), _end(node), ")")]
            yield _Site("swap_boolean", i, tuple(e for e in edits if e), _set_attr("op", swap[0]))
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        yield _Site(
            "flip_bool_constant",
            i,
            (_Edit(_start(node), _end(node), str(not node.value)),),
            _set_attr("value", not node.value, raw=True),
        )
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        negated = isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.USub)
        new = node.value + 1 if node.value == 0 or negated else node.value - 1
        yield _Site(
            "off_by_one", i, (_Edit(_start(node), _end(node), str(new)),), _set_attr("value", new, raw=True)
        )
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "range"
        and 1 <= len(node.args) <= 3
        and not node.keywords
    ):
        k = 0 if len(node.args) == 1 else 1
        stop = node.args[k]
        if isinstance(stop, _ATOMS):
            yield _Site("shorten_range", i, (_Edit(_end(stop), _end(stop), " - 1"),), _shorten_arg(k))
    elif isinstance(node, ast.If | ast.IfExp):
        test = node.test
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = _segment_bytes(lines, test.operand)
            edit = _Edit(_start(test), _end(test), inner)
            yield _Site("negate_condition", i, (edit,), _set_attr("test", None, unwrap_not=True))
        else:
            text = _segment_bytes(lines, test)
            new = f"not {text}" if isinstance(test, _ATOMS) else f"not ({text})"
            yield _Site(
                "negate_condition", i, (_Edit(_start(test), _end(test), new),), _set_attr("test", None)
            )


def _start(node: ast.AST) -> tuple[int, int]:
    return node.lineno, node.col_offset  # type: ignore[attr-defined]


def _end(node: ast.AST) -> tuple[int, int]:
    return node.end_lineno, node.end_col_offset  # type: ignore[attr-defined]


def _offset(lines: list[bytes], pos: tuple[int, int]) -> int:
    return sum(len(line) for line in lines[: pos[0] - 1]) + pos[1]


def _segment_bytes(lines: list[bytes], node: ast.AST) -> str:
    data = b"".join(lines)
    return data[_offset(lines, _start(node)) : _offset(lines, _end(node))].decode()


def _token_edit(lines: list[bytes], before: ast.AST, after: ast.AST, pattern: str, new: str) -> _Edit | None:
    """The edit replacing the operator token found between two operands (parentheses may surround it)."""
    data = b"".join(lines)
    lo, hi = _offset(lines, _end(before)), _offset(lines, _start(after))
    gap = data[lo:hi].decode()
    if "#" in gap:  # a comment between the operands: the token search could match inside it
        return None
    match = re.search(pattern, gap)
    if match is None:
        return None
    start, stop = lo + len(gap[: match.start()].encode()), lo + len(gap[: match.end()].encode())
    return _Edit(_pos(lines, start), _pos(lines, stop), new)


def _pos(lines: list[bytes], offset: int) -> tuple[int, int]:
    for lineno, line in enumerate(lines, start=1):
        if offset <= len(line):
            return lineno, offset
        offset -= len(line)
    raise ValueError("offset past the end of the source")


def _set_item(field: str, k: int, cls: type[ast.AST]) -> Callable[[ast.AST], None]:
    def apply(node: ast.AST) -> None:
        getattr(node, field)[k] = cls()

    return apply


def _set_attr(
    field: str, value: object, *, raw: bool = False, unwrap_not: bool = False
) -> Callable[[ast.AST], None]:
    def apply(node: ast.AST) -> None:
        if raw:
            setattr(node, field, value)
        elif field == "test":  # negate_condition
            test = node.test  # type: ignore[attr-defined]
            node.test = test.operand if unwrap_not else ast.UnaryOp(op=ast.Not(), operand=test)  # type: ignore[attr-defined]
        else:
            setattr(node, field, value())  # type: ignore[operator]

    return apply


def _shorten_arg(k: int) -> Callable[[ast.AST], None]:
    def apply(node: ast.AST) -> None:
        node.args[k] = ast.BinOp(left=node.args[k], op=ast.Sub(), right=ast.Constant(1))  # type: ignore[attr-defined]

    return apply


def _realize(source: str, tree: ast.Module, lines: list[bytes], site: _Site) -> Mutant | None:
    """Apply the site's text edits; keep the mutant only if it parses to exactly the intended tree."""
    data = b"".join(lines)
    spans = sorted(
        ((_offset(lines, e.start), _offset(lines, e.end), e.text) for e in site.edits), reverse=True
    )
    for lo, hi, text in spans:
        data = data[:lo] + text.encode() + data[hi:]
    mutated = data.decode()
    expected = copy.deepcopy(tree)
    site.apply(list(ast.walk(expected))[site.node_index])
    try:
        got = ast.parse(mutated)
    except SyntaxError:
        return None
    if ast.dump(got) != ast.dump(expected) or ast.dump(got) == ast.dump(tree):
        return None
    first = min(site.edits, key=lambda e: e.start)
    main = max(site.edits, key=lambda e: len(e.text))  # the operator edit, not an added parenthesis
    before = b"".join(lines)[_offset(lines, main.start) : _offset(lines, main.end)].decode()
    return Mutant(site.operator, first.start[0], before, main.text, mutated)
