"""``./install.sh --bench`` provides what every script in ``benchmarks/`` needs (no installing here).

The options are checked by running ``install.sh`` with ones that exit before it does anything. The
benchmarks are read, not run: each script's imports must come from the standard library, harnessrl,
a sibling script or an example, or a distribution that ``install.sh`` puts into ``.venv`` (the
requirement closure of ``harnessrl[all,dev]`` and the ``"${PIP[@]}" "name==version"`` lines, TRL's
included); and every extra venv a script names (``.venv-vllm``, ``.bench/agl-venv``) and every
program it looks up with ``shutil.which`` must be one ``install.sh`` installs. A benchmark that needs
something new fails here until ``install.sh`` provides it.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "install.sh"
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))
# A pinned install into .venv: `"${PIP[@]}" ... "trl==$TRL_VERSION"` or `"${PIP[@]}" --no-deps "verl==0.9.1"`.
_PIP_PIN = re.compile(r'"([A-Za-z0-9][A-Za-z0-9_.\-]*)==')
# A folder of the checkout holding another environment: `.venv-vllm`, `.bench/agl-venv`, or in code
# `ROOT / ".bench" / "agl-venv"`.
_ENV_DIR = re.compile(r"""(\.venv-[\w-]+|\.bench(?:/|["']\s*/\s*["'])[\w-]+)""")


def _install_sh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(INSTALL), *args], capture_output=True, text=True, timeout=30)


def test_unknown_option_prints_usage_and_exits_2() -> None:
    done = _install_sh("--bogus")
    assert done.returncode == 2
    assert "--bogus" in done.stderr and "Usage: ./install.sh" in done.stderr
    assert done.stdout == ""  # nothing was installed or attempted


def test_help_names_bench_and_what_it_installs() -> None:
    done = _install_sh("--help")
    assert done.returncode == 0, done.stderr
    assert "--bench" in done.stdout
    for part in ("TRL", "Agent Lightning", ".bench/agl-venv", ".venv-vllm"):
        assert part in done.stdout


def _imported_modules(script: Path) -> set[str]:
    """Top-level names of every absolute import in the script, at any depth (lazy imports too)."""
    modules: set[str] = set()
    for node in ast.walk(ast.parse(script.read_text(), filename=str(script))):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module.split(".")[0])
    return modules


def _local_modules() -> set[str]:
    """Modules the scripts import from the checkout: each other, and examples' files (``agent``)."""
    return {p.stem for p in SCRIPTS} | {p.stem for p in (ROOT / "examples").rglob("*.py")}


def _installed_closure() -> set[str]:
    """Canonical names of the distributions ``install.sh`` installs into .venv, with their requirements."""
    text = INSTALL.read_text()
    pip_lines = [line for line in text.splitlines() if '"${PIP[@]}"' in line]
    roots = [(name, frozenset()) for line in pip_lines for name in _PIP_PIN.findall(line)]
    roots.append(("harnessrl", frozenset({"all", "dev"})))  # "${PIP[@]}" -e ".[all,dev]"
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = roots
    while todo:
        name, extras = todo.pop()
        key = (canonicalize_name(name), extras)
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here (e.g. TRL before `--bench`): the name itself is still provided
        for line in requires:
            req = Requirement(line)
            envs = [{"extra": e} for e in extras] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((req.name, frozenset(req.extras)))
    return {name for name, _ in seen}


def test_every_benchmark_import_is_installed_by_install_sh() -> None:
    local = _local_modules()
    provided = _installed_closure()
    assert {"torch", "transformers"} <= provided, "install.sh's pins or harnessrl[all] were not found"
    module_dists = metadata.packages_distributions()
    missing: list[str] = []
    for script in SCRIPTS:
        for module in sorted(_imported_modules(script)):
            if module in sys.stdlib_module_names or module == "harnessrl" or module in local:
                continue
            # A module not installed here (TRL before `--bench`) must be a distribution's own name.
            dists = {canonicalize_name(d) for d in module_dists.get(module, [module])}
            if not dists & provided:
                missing.append(f"{script.name}: import {module} (distribution {', '.join(sorted(dists))})")
    assert not missing, "benchmarks import what install.sh does not install:\n" + "\n".join(missing)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_extra_environment_and_program_is_installed_by_install_sh(script: Path) -> None:
    text = INSTALL.read_text()
    source = script.read_text()
    for found in _ENV_DIR.findall(source):
        folder = re.sub(r"""["']\s*/\s*["']""", "/", found)
        assert re.search(rf"^\w+_VENV={re.escape(folder)}$", text, re.M), (
            f"{script.name} uses {folder}, which install.sh does not create"
        )
    for program in re.findall(r"""shutil\.which\(["']([\w.-]+)["']\)""", source):
        assert f"command -v {program} " in text, (
            f"{script.name} needs {program}, which install.sh does not install"
        )


def test_bench_installs_into_git_ignored_folders() -> None:
    ignored = subprocess.run(
        ["git", "check-ignore", ".bench/agl-venv/bin/python", ".venv-vllm/bin/python"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert ignored.stdout.split() == [".bench/agl-venv/bin/python", ".venv-vllm/bin/python"]
