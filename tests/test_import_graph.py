"""Imports point one way: no import cycle among harnessrl's modules or its packages, and the layering
rules of docs/STYLE (``schemas``/``errors`` <- ``store`` <- ``gateway``, ``controller``, ``trainer``
<- ``cli``) hold.

Every module under ``src/harnessrl`` is parsed with ``ast`` (no import runs): module-level and
function-level ``import``/``from`` statements count, relative imports are resolved, and ``from
harnessrl.x import y`` is an edge to ``harnessrl.x.y`` when ``y`` is a submodule. Imports under ``if
TYPE_CHECKING:`` are left out: they never run, so they cannot form an import-time cycle, and naming
a type in an annotation is how a module uses a protocol without depending on its implementation.

Imports by string count too: ``importlib.import_module("harnessrl.x")`` (or ``import_module``,
``__import__``) with a literal name, and a literal ``"harnessrl.x:attr"`` (an entry-point style
reference, resolved by whoever reads it), are edges like ``import harnessrl.x``, so a table of
module names cannot hide a cycle.

A package is ``harnessrl.<name>`` (``harnessrl.gateway``); a top-level module (``harnessrl.errors``)
is its own. Entry points (``__main__`` modules) compose the app, so the layering rules do not apply
to them; nothing may import one.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

Graph = Mapping[str, set[str]]

#: (importer, imported) packages: the first may not import the second, directly or not at all.
ONE_WAY = [
    ("harnessrl.trainer", "harnessrl.cli"),  # the trainer is started by the CLI, not the reverse
    ("harnessrl.gateway", "harnessrl.dashboard"),  # the dashboard is mounted by whoever composes the app
    ("harnessrl.gateway", "harnessrl.trainer"),
    ("harnessrl.gateway", "harnessrl.controller"),
    ("harnessrl.tasks", "harnessrl.controller"),  # evaluators use tasks, tasks never evaluators
    ("harnessrl.tasks", "harnessrl.data"),
    ("harnessrl.sandbox", "harnessrl.controller"),  # the controller launches into the sandbox
    ("harnessrl.store", "harnessrl.gateway"),
    ("harnessrl.store", "harnessrl.controller"),
    ("harnessrl.store", "harnessrl.trainer"),
    ("harnessrl.algorithms", "harnessrl.trainer"),  # pure RL math: no loop, no processes
    ("harnessrl.trajectory", "harnessrl.trainer"),
]

#: Modules that import no other harnessrl module: the shared vocabulary everything else builds on.
LEAVES = ["harnessrl.errors", "harnessrl.schemas"]

#: Subpackages a component uses as parts: each imports nothing else of its component, so it can be
#: read, tested and reused without it (``sft.select`` reads the audit's rules, ``trainer.config``
#: parses the evaluator section, examples/swe/make_tasks.py scores with an evaluator). The audit is
#: pure analysis; the evaluators score with ``tasks`` and the ``sandbox``.
SELF_CONTAINED = ["harnessrl.controller.audit", "harnessrl.controller.evaluators"]


# -- the graph ---------------------------------------------------------------------------------------


def find_modules(src: Path, root: str = "harnessrl") -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package ``__init__``) for every module under ``src/root``."""
    modules = {}
    for path in sorted((src / root).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        modules[".".join(parts)] = (path, is_package)
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


_BY_STRING = {"import_module", "__import__"}
_REFERENCE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def _by_string(node: ast.Call) -> ast.Import | None:
    """``importlib.import_module("harnessrl.x")`` (a literal name) as ``import harnessrl.x``."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name not in _BY_STRING or not node.args:
        return None
    arg = node.args[0]
    if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
        return None
    return ast.Import(names=[ast.alias(name=arg.value)])


def _imports(tree: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement at any depth, and every import by a literal string, except those under
    ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.Call) and (by_string := _by_string(node)) is not None:
            yield by_string
            stack.extend(ast.iter_child_nodes(node))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _REFERENCE.fullmatch(node.value)
        ):
            yield ast.Import(names=[ast.alias(name=node.value.partition(":")[0])])
        elif isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def _resolve(name: str, modules: Mapping[str, object]) -> str | None:
    """The module ``name`` runs: itself, or its nearest enclosing package that is a module."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(src: Path = SRC, root: str = "harnessrl") -> dict[str, set[str]]:
    """Module -> the harnessrl modules it imports."""
    modules = find_modules(src, root)
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                candidates = [
                    f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                    for alias in node.names
                ]
            for candidate in candidates:
                if candidate == root or candidate.startswith(root + "."):
                    target = _resolve(candidate, modules)
                    if target is not None and target != name:
                        targets.add(target)
        graph[name] = targets
    return graph


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def package_graph(graph: Graph) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = defaultdict(set)
    for module, targets in graph.items():
        packages[package_of(module)].update(
            package_of(t) for t in targets if package_of(t) != package_of(module)
        )
    return dict(packages)


def find_cycles(graph: Graph) -> list[list[str]]:
    """One cycle per strongly connected component with more than one node, as a path ``a -> ... -> a``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(start: str) -> None:  # Tarjan's algorithm, iterative (no recursion limit)
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_path(graph, component) for component in components]


def _cycle_path(graph: Graph, component: set[str]) -> list[str]:
    """A shortest cycle through the component's first node (breadth-first inside the component)."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph.get(node, ())):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if target in component and target not in came_from:
                    came_from[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a component always has one


def reaches(graph: Graph, source: str, target: str) -> list[str] | None:
    """A path ``source -> ... -> target`` if there is one."""
    came_from: dict[str, str] = {source: source}
    frontier = [source]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph.get(node, ())):
                if nxt not in came_from:
                    came_from[nxt] = node
                    if nxt == target:
                        path = [nxt]
                        while path[-1] != source:
                            path.append(came_from[path[-1]])
                        return path[::-1]
                    following.append(nxt)
        frontier = following
    return None


def _show(cycles: list[list[str]]) -> str:
    return "\n".join("  " + " -> ".join(cycle) for cycle in cycles)


# -- the rules -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_no_import_cycle_between_modules(graph: Graph) -> None:
    cycles = find_cycles(graph)
    assert not cycles, "import cycles between modules:\n" + _show(cycles)


def test_no_import_cycle_between_packages(graph: Graph) -> None:
    cycles = find_cycles(package_graph(graph))
    detail = []
    for cycle in cycles:
        for a, b in zip(cycle, cycle[1:], strict=False):
            edges = sorted(
                f"{m} -> {t}"
                for m, ts in graph.items()
                for t in ts
                if package_of(m) == a and package_of(t) == b
            )
            detail.append(f"  {a} -> {b}: {', '.join(edges)}")
    assert not cycles, "import cycles between packages:\n" + _show(cycles) + "\nvia\n" + "\n".join(detail)


def test_layers_import_one_way(graph: Graph) -> None:
    entry_points = {m for m in graph if m.rsplit(".", 1)[-1] == "__main__"}
    layered = {
        m: {t for t in ts if t not in entry_points} for m, ts in graph.items() if m not in entry_points
    }
    packages = package_graph(layered)
    broken = []
    for importer, imported in ONE_WAY:
        path = reaches(packages, importer, imported)
        if path is not None:
            first = sorted(
                f"{m} -> {t}"
                for m, ts in layered.items()
                for t in ts
                if package_of(m) == path[0] and package_of(t) == path[1]
            )
            broken.append(f"  {' -> '.join(path)} (first step: {', '.join(first)})")
    assert not broken, "imports against the layering:\n" + "\n".join(broken)


def test_vocabulary_modules_are_leaves(graph: Graph) -> None:
    for leaf in LEAVES:
        assert graph[leaf] <= {"harnessrl.errors"}, f"{leaf} imports {sorted(graph[leaf])}"
    assert graph["harnessrl.errors"] == set()


def test_component_parts_stand_alone(graph: Graph) -> None:
    def within(module: str, prefix: str) -> bool:
        return module == prefix or module.startswith(prefix + ".")

    for part in SELF_CONTAINED:
        assert part in graph, f"{part} is not a package any more: update SELF_CONTAINED"
        component = part.rsplit(".", 1)[0]
        outside = sorted(
            f"{m} -> {t}"
            for m, ts in graph.items()
            if within(m, part)
            for t in ts
            if within(t, component) and not within(t, part)
        )
        assert not outside, f"{part} imports the rest of {component}: {outside}"


def test_nothing_imports_an_entry_point(graph: Graph) -> None:
    into_main = sorted(f"{m} -> {t}" for m, ts in graph.items() for t in ts if t.endswith(".__main__"))
    assert not into_main, into_main


# -- the checker itself --------------------------------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_checker_finds_a_synthetic_cycle(tmp_path: Path) -> None:
    src = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "a/__init__.py": "",
            "a/one.py": "from pkg.b import two\n",  # from-import of a submodule
            "b/__init__.py": "",
            "b/two.py": "def f():\n    from ..c import three\n",  # relative, inside a function
            "c/__init__.py": "",
            "c/three.py": "import pkg.a.one as one\n",  # plain import
            "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import one\n",
        },
    )
    graph = import_graph(src, "pkg")
    assert graph["pkg.a.one"] == {"pkg.b.two"}
    assert graph["pkg.b.two"] == {"pkg.c.three"}
    assert graph["pkg.c.three"] == {"pkg.a.one"}
    assert graph["pkg.d"] == set()  # TYPE_CHECKING imports are not edges
    assert find_cycles(graph) == [["pkg.a.one", "pkg.b.two", "pkg.c.three", "pkg.a.one"]]
    assert find_cycles(package_graph(graph)) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    assert reaches(package_graph(graph), "pkg.a", "pkg.c") == ["pkg.a", "pkg.b", "pkg.c"]


def test_the_checker_accepts_a_dag(tmp_path: Path) -> None:
    src = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "low.py": "",
            "mid.py": "from . import low\nfrom .low import something\n",
            "top.py": "import pkg.mid\nfrom pkg import low\n",
        },
    )
    graph = import_graph(src, "pkg")
    assert graph["pkg.mid"] == {"pkg.low"} and graph["pkg.top"] == {"pkg.mid", "pkg.low"}
    assert find_cycles(graph) == [] and reaches(graph, "pkg.low", "pkg.top") is None


def test_the_checker_follows_imports_by_string(tmp_path: Path) -> None:
    src = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "table.py": "import importlib\n\ndef load():\n    return importlib.import_module('pkg.user')\n",
            "user.py": "from pkg import table\n",
            "other.py": "from importlib import import_module\nimport_module('pkg.user')\nimport_module(name)\n",
            "refs.py": "TABLE = {'x': 'pkg.user:convert', 'y': 'not a reference: pkg.table'}\n",
        },
    )
    graph = import_graph(src, "pkg")
    assert graph["pkg.table"] == {"pkg.user"} and graph["pkg.other"] == {"pkg.user"}
    assert graph["pkg.refs"] == {"pkg.user"}
    assert find_cycles(graph) == [["pkg.table", "pkg.user", "pkg.table"]]
