"""What the user-facing docs point at exists: relative links (files and ``#anchors``), the
``benchmarks/results/*.json`` files they cite, the Python modules and config fields they name in
backticks, and every ``harnessrl`` command and option (the CLI had options no page named:
``engine serve --backend``, ``--version``; and docs/environments.md named
``trainer.step.common_failure``, which lives in ``trainer/failures.py``)."""

from __future__ import annotations

import ast
import functools
import re
import shlex
import typing
from pathlib import Path

import pytest
import typer
from pydantic import BaseModel

from harnessrl.cli.main import app
from harnessrl.controller.stack import RolloutConfig
from harnessrl.sft.config import SftConfig
from harnessrl.trainer.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "harnessrl"
PAGES = sorted(
    [
        ROOT / "README.md",
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("docs/examples/*.md"),
        *ROOT.glob("examples/*/README.md"),
        ROOT / "benchmarks" / "README.md",
    ]
)

# Names other pages still get wrong, reported to their owners; remove an entry once its page is fixed.
KNOWN_DRIFT: set[tuple[str, str]] = set()


def rel(page: Path) -> str:
    return page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else str(page)


def prose(text: str) -> str:
    """``text`` without its fenced code blocks (a ``# comment`` in one is not a heading)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def code_spans(text: str, *, skip: tuple[str, ...] = ()) -> list[str]:
    """Inline code and the lines of fenced blocks (continuation lines joined), but blocks in the
    ``skip`` languages."""
    fenced = re.findall(r"^```([^\n]*)\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    inline = re.findall(r"`([^`\n]+)`", prose(text))
    lines = [
        line
        for lang, block in fenced
        if lang.strip() not in skip
        for line in block.replace("\\\n", " ").splitlines()
    ]
    return inline + lines


@functools.cache
def anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``,
    a repeated id suffixed ``-1``, ``-2``..."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", prose(page.read_text()), flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", prose(page.read_text())):
        if re.match(r"[a-z]+:", link):  # https:, mailto:
            continue
        path, _, fragment = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{rel(page)}: {link} (no such file)")
        elif fragment and target.suffix == ".md" and fragment not in anchors(target):
            broken.append(f"{rel(page)}: {link} (no such heading)")
    return broken


def test_every_relative_link_resolves_to_a_file_and_heading():
    assert [b for page in PAGES for b in broken_links(page)] == []


def test_the_link_check_notices_a_missing_file_and_a_missing_heading(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## Two words\n")
    page.write_text(
        "[ok](other.md#two-words) [gone](missing.md) [bad](other.md#nowhere) [self](#top)\n# Top\n"
    )
    assert broken_links(page) == [
        f"{page}: missing.md (no such file)",
        f"{page}: other.md#nowhere (no such heading)",
    ]


def test_every_cited_results_file_exists():
    results = ROOT / "benchmarks" / "results"
    missing = []
    for page in PAGES:
        for name in re.findall(r"results/([\w.-]+\.json)\b", page.read_text()):
            if not (results / name).is_file():
                missing.append(f"{rel(page)}: results/{name}")
    assert missing == []


# -- Python modules and config fields named in backticks ------------------------------------------------


def _models(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type):
        return [annotation] if issubclass(annotation, BaseModel) else []
    return [model for arg in typing.get_args(annotation) for model in _models(arg)]


SECTIONS: dict[str, list[type[BaseModel]]] = {}
for _config in (TrainConfig, RolloutConfig, SftConfig):
    for _name, _info in _config.model_fields.items():
        SECTIONS.setdefault(_name, []).extend(_models(_info.annotation))


def is_config_field(dotted: str) -> bool:
    """``trainer.lora.r``: a field path of some config file's sections."""
    section, *parts = dotted.split(".")
    models = SECTIONS.get(section, [])
    for part in parts:
        found = [m for m in models if part in m.model_fields]
        if not found:
            return False
        models = [sub for m in found for sub in _models(m.model_fields[part].annotation)]
        if not models:
            return True
    return True


@functools.cache
def top_level_names(path: Path) -> frozenset[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


@functools.cache
def methods(package: Path) -> frozenset[str]:
    """Every function and method defined anywhere in ``package``."""
    return frozenset(
        node.name
        for path in package.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    )


def is_module_path(dotted: str) -> bool:
    """``trainer.failures.common_failure``, ``harnessrl.gateway.errors.ERROR_SHAPES``: a package or
    module of harnessrl, optionally followed by a name defined in it (attributes after it unchecked);
    or a top-level package and one of its methods (``store.list_calls``: a store object's)."""
    parts = dotted.removeprefix("harnessrl.").split(".")
    folder = SRC
    for i, part in enumerate(parts):
        if (folder / part).is_dir():
            folder = folder / part
        elif (folder / f"{part}.py").is_file():
            return i + 1 == len(parts) or parts[i + 1] in top_level_names(folder / f"{part}.py")
        else:
            init = folder / "__init__.py"
            if init.is_file() and part in top_level_names(init):
                return True
            return i == 1 and part in methods(folder)
    return True


PACKAGES = {p.name for p in SRC.iterdir() if p.is_dir() and p.name != "__pycache__"}
# Objects a page names by a variable that happens to share a package's name (verl's batch ``data``).
# and TRL's ``trainer``.
OBJECTS = {"data.meta_info", "trainer.train"}
SUFFIXES = {"py", "md", "toml", "json", "jsonl", "db", "yaml", "txt", "sh", "jinja"}


def unknown_names(page: Path) -> list[str]:
    unknown = []
    for span in code_spans(page.read_text(), skip=("python",)):  # Python's variables are its own
        for dotted in re.findall(r"(?<![\w/.\-\[])((?:harnessrl\.)?[a-z_]+(?:\.[A-Za-z_]\w*)+)", span):
            first = dotted.removeprefix("harnessrl.").split(".")[0]
            if dotted.rsplit(".", 1)[-1] in SUFFIXES or first not in PACKAGES or dotted in OBJECTS:
                continue
            if not (is_module_path(dotted) or is_config_field(dotted)):
                unknown.append(dotted)
    return unknown


def test_every_module_and_config_field_named_in_backticks_exists():
    unknown = {(rel(page), name) for page in PAGES for name in unknown_names(page)} - KNOWN_DRIFT
    assert sorted(unknown) == []


def test_the_name_check_knows_modules_fields_and_typos(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "`trainer.failures.common_failure` `harnessrl.gateway.errors.ERROR_SHAPES` `trainer.lora.r`\n"
        "`gateway.lease_s` `engines/launch.py` `trainer.step.common_failure` `trainer.lora.rank`\n"
        "```toml\ngateway.nothing_here = 1\n```\n"
    )
    assert unknown_names(page) == ["trainer.step.common_failure", "trainer.lora.rank", "gateway.nothing_here"]


# -- the CLI ------------------------------------------------------------------------------------------


def commands() -> list[tuple[str, typing.Any]]:
    def walk(command: typing.Any, path: list[str]) -> typing.Iterator[tuple[str, typing.Any]]:
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk(sub, [*path, name])
        else:
            yield " ".join(path), command

    return list(walk(typer.main.get_command(app), []))


def test_the_walk_sees_every_command():
    names = {name for name, _ in commands()}
    assert {"train", "rollout", "engine serve", "data split", "images prune", "version"} <= names


def test_every_command_and_option_is_in_a_doc():
    texts = {page: page.read_text() for page in PAGES}
    spans = {page: "\n".join(code_spans(text)) for page, text in texts.items()}
    missing = []
    for name, command in commands():
        pages = [p for p, s in spans.items() if re.search(rf"harnessrl {re.escape(name)}(?![\w-])", s)]
        if not pages:
            missing.append(f"harnessrl {name}")
            continue
        for param in command.params:
            # The name that changes something: --merged, not --no-merged; --no-repo-leakage, not
            # --allow-repo-leakage (the default). An option shown in any page about the command counts.
            flags = [o for o in param.opts if o.startswith("--")]
            if getattr(param, "is_flag", False) and param.default is True:
                flags = [o for o in param.secondary_opts if o.startswith("--")] or flags
            for flag in flags:
                if not any(re.search(rf"{re.escape(flag)}(?![\w-])", texts[p]) for p in pages):
                    missing.append(f"harnessrl {name} {flag}")
    top_level = [o for p in typer.main.get_command(app).params for o in p.opts if o.startswith("--")]
    missing += [f"harnessrl {o}" for o in top_level if not any(o in s for s in spans.values())]
    assert missing == []


def bad_command_lines(text: str) -> list[str]:
    """Command lines in fenced blocks that name no ``harnessrl`` command, or an option it does not
    take (values are not checked: ``--set k=v`` placeholders and ``N`` are fine)."""
    root = typer.main.get_command(app)
    bad = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            if not re.match(r"\s*(\S*/)?harnessrl\s", line):
                continue
            try:
                words = shlex.split(re.split(r"\s[#|;&>]", line.split("harnessrl", 1)[1])[0])
            except ValueError:
                continue
            command = root
            while hasattr(command, "commands") and words and words[0] in command.commands:
                command, words = command.commands[words[0]], words[1:]
            if hasattr(command, "commands"):
                bad.append(f"{line.strip()} (no such command)")
                continue
            known = {o for p in command.params for o in [*p.opts, *getattr(p, "secondary_opts", [])]}
            bad += [
                f"{line.strip()} ({word})"
                for word in words
                if word.startswith("--") and word.split("=", 1)[0] not in known | {"--help"}
            ]
    return bad


@pytest.mark.parametrize("page", [p for p in PAGES if "harnessrl" in p.read_text()], ids=rel)
def test_every_harnessrl_command_line_shown_parses(page):
    assert bad_command_lines(page.read_text()) == []


def test_the_command_line_check_notices_unknown_commands_and_options():
    text = (
        "```bash\n"
        ".venv/bin/harnessrl train examples/tiny/train.toml --set trainer.steps=2   # fine\n"
        "harnessrl engine serve tiny --kv-cache-gib 2 --gpus 2\n"
        "harnessrl images build CONFIG \\\n  --store DIR --pull\n"
        "harnessrl imagez list\n"
        "```\n"
    )
    assert bad_command_lines(text) == [
        "harnessrl engine serve tiny --kv-cache-gib 2 --gpus 2 (--gpus)",
        "harnessrl images build CONFIG    --store DIR --pull (--pull)",
        "harnessrl imagez list (no such command)",
    ]


# -- metric names -------------------------------------------------------------------------------------


def metric_names() -> set[str]:
    """The names docs/metrics.md documents (first cell of its table rows)."""
    names: set[str] = set()
    for line in (ROOT / "docs" / "metrics.md").read_text().splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return names


def unknown_metrics(text: str, documented: set[str]) -> list[str]:
    """Backticked ``group/name`` metrics that docs/metrics.md does not name: of a documented group
    (``reward/``, ``trajectory/``...), or a documented name cut short (``breaks/new_context`` for
    ``trajectory/breaks/new_context``); ``<reason>``-style placeholders match any part."""
    groups = {name.split("/")[0] for name in documented if "/" in name}
    unknown = []
    for span in re.findall(r"`([^`\n]+)`", prose(text)):
        if not re.fullmatch(r"[a-z_]+(/[\w<>-]+)+", span):  # no file paths (`prompt/splice.py`)
            continue
        if span.split("/")[0] not in groups and not any(name.endswith(f"/{span}") for name in documented):
            continue
        pattern = re.sub(r"<[^>]+>", r"[\\w.-]+", re.escape(span).replace(r"\<", "<").replace(r"\>", ">"))
        if not any(re.fullmatch(pattern, name) for name in documented):
            unknown.append(span)
    return unknown


def test_every_metric_a_page_names_is_in_the_metrics_reference():
    from harnessrl.dashboard.charts import FORMER_NAMES

    documented = metric_names() | set(FORMER_NAMES.values())  # dashboard.md lists the old names
    unknown = [
        f"{rel(page)}: {name}" for page in PAGES for name in unknown_metrics(page.read_text(), documented)
    ]
    assert unknown == []


def test_the_metric_check_notices_a_shortened_name():
    documented = metric_names()
    text = "`trajectory/breaks/new_context` `trajectory/calls_dropped/<reason>` `breaks/new_context` `reward/meen`"
    assert unknown_metrics(text, documented) == ["breaks/new_context", "reward/meen"]


def test_redteam_says_which_audit_flags_zero_the_reward_by_default():
    """docs/redteam.md said every flag zeroes the reward; ``outside_workspace`` only records."""
    from harnessrl.controller.audit.report import ALL_RULES, ZERO_REWARD_RULES

    text = " ".join((ROOT / "docs" / "redteam.md").read_text().split())
    claim = re.search(r"By default every audit flag (?:but ((?:`\w+`(?:, | and )?)+) )?", text)
    assert claim is not None
    excepted = set(re.findall(r"`(\w+)`", claim.group(1) or ""))
    assert excepted == set(ALL_RULES) - set(ZERO_REWARD_RULES)


def environment_reads(source: str) -> set[str]:
    """``HARNESSRL_*`` names ``source`` reads from its environment: ``os.environ.get(N)``,
    ``os.getenv(N)``, ``os.environ.pop(N)``, ``os.environ[N]``, with ``N`` a string or a module-level
    constant holding one (``VLLM_PYTHON_ENV = "HARNESSRL_VLLM_PYTHON"``). Names harnessrl only sets
    for its children (markers, the task) are not settings and not collected."""
    tree = ast.parse(source)
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name) and isinstance(node.value.value, str)
    }

    def name(arg: ast.expr) -> str | None:
        value = arg.value if isinstance(arg, ast.Constant) else constants.get(getattr(arg, "id", ""))
        return value if isinstance(value, str) and value.startswith("HARNESSRL_") else None

    def is_environ(node: ast.expr) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
            isinstance(node, ast.Name) and node.id == "environ"
        )

    read = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
            func = node.func
            if (func.attr in ("get", "pop") and is_environ(func.value)) or func.attr == "getenv":
                read.add(name(node.args[0]))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and is_environ(node.value):
            read.add(name(node.slice))
    return read - {None}  # type: ignore[arg-type]


def test_every_environment_variable_the_code_reads_is_in_a_doc():
    """``HARNESSRL_PODMAN`` (which podman to run) was read by the code and named by no page."""
    internal = {"HARNESSRL_LAUNCHER_PARENT"}  # the sandbox launcher's own, removed before bwrap starts
    names = {n for path in SRC.rglob("*.py") for n in environment_reads(path.read_text())}
    # constants too: engines/launch.py reads VLLM_PYTHON_ENV
    assert {"HARNESSRL_PODMAN", "HARNESSRL_VLLM_PYTHON", "HARNESSRL_ADMIN_KEY"} <= names
    text = "\n".join(page.read_text() for page in PAGES)
    undocumented = sorted(n for n in names - internal if not re.search(rf"{n}(?![A-Z0-9_])", text))
    assert undocumented == []


def test_the_environment_scan_sees_reads_not_writes():
    source = (
        'import os\nNAME = "HARNESSRL_B"\nos.environ.get("HARNESSRL_A")\nos.getenv(NAME)\n'
        'x = os.environ["HARNESSRL_C"]\nos.environ["HARNESSRL_SET"] = "1"\nenv = {"HARNESSRL_MARK": "1"}\n'
    )
    assert environment_reads(source) == {"HARNESSRL_A", "HARNESSRL_B", "HARNESSRL_C"}


def test_a_run_folders_store_is_named_as_runs_name_it():
    """A run folder's store is ``harnessrl.db`` (``trainer/run.py``); docs/verl.md's sketch opened
    ``runs/my-run/store.db``, which ``open_store`` would create empty: a step with nothing in it."""
    run_py = (SRC / "trainer" / "run.py").read_text()
    assert 'self.run_dir / "harnessrl.db"' in run_py
    stores = [
        f"{rel(page)}: {path}"
        for page in PAGES
        for path in re.findall(r"runs/[\w.<>{}-]+/[\w.-]+\.db\b", page.read_text())
        if not path.endswith("/harnessrl.db")
    ]
    assert stores == []


def test_the_gateways_error_table_has_a_row_for_every_error_shape():
    """docs/gateway.md's error table says it is ``ERROR_SHAPES``: a class added there without a row
    (409 ``conflict``, 503 ``gateway_stopping``, 500 ``bad_config`` were missing) is found here."""
    from harnessrl.gateway.errors import ERROR_SHAPES

    page = (ROOT / "docs" / "gateway.md").read_text()
    missing = sorted(
        {(shape.status, shape.code) for shape in ERROR_SHAPES.values()}
        - {(int(m[1]), m[2]) for m in re.finditer(r"^\| (\d{3}) \| `([a-z_]+)` \|", page, re.M)}
    )
    assert missing == []
