"""Build the SWE-smith-shaped example's tasks from real repositories, each validated inside its image.

    python examples/swe/make_tasks.py --out examples/swe/tasks            # 4 bugs per project, 12 tasks
    python examples/swe/make_tasks.py --out DIR --per-project 10 --seed 1 --projects toolz,inflection

For each project of ``projects.toml`` (a pinned PyPI source distribution that ships its tests):

1. **The repository.** The sdist is downloaded with pip (``--no-binary :all: --no-deps``), checked
   against its pinned sha256 and unpacked; build leftovers (``*.egg-info``, ``PKG-INFO``, bytecode)
   are dropped and the project's ``pytest.ini`` is written beside the sources.
2. **Its image.** ``harnessrl images`` builds the environment the config names for it
   (``[harness.environment.images."swe/<project>"]`` of ``train.toml``: the Debian base plus the
   test dependencies). Every test run below happens **inside that image**, in harnessrl's sandbox.
3. **The baseline.** pytest collects the suite and runs it on the unmodified code; tests that do not
   pass there are left out of every list.
4. **Bugs.** Every single-spot mutant of the project's own top-level functions in ``modules``
   (``harnessrl.tasks.coding.mutations``: flipped comparisons, swapped operators, off-by-ones...),
   tried in an order seeded by ``(seed, project)``, one bug per function. A mutant is kept when, run
   inside the image, some baseline tests fail (``FAIL_TO_PASS``) and others still pass
   (``PASS_TO_PASS``: every other baseline test of the suite, as SWE-smith lists them).
5. **Confirmation through the real scorer.** The example's own evaluator (``[evaluator]`` of
   ``train.toml``: ``harnessrl.tasks.pytest_scoring`` in a fresh sandbox over the image) scores the
   buggy workspace 0 with every ``PASS_TO_PASS`` test passing and the gold workspace 1; a task that
   does not is dropped (``unconfirmed`` in the report).
6. **The task.** A git repository whose first commit is the project and whose HEAD ("Refactor
   <function>") is the bug; an issue-style problem statement from the first failing test; the
   project's test files under ``hidden/<id>/files`` (restored by the scorer before it runs); the gold
   patch and the mutation under ``gold/<id>`` (no evaluator names that folder).

Output (``--out``): ``tasks.jsonl`` (SWE-smith-shaped records), ``report.json`` (also the last stdout
line), ``gold_fix.json`` (a scripted policy that applies each task's gold fix: the calibration's
100% control; its first reply carries every task's fix, so give it ``trainer.max_tokens`` to match),
``repos/``, ``hidden/``, ``gold/``, ``sdists/`` (the downloads, reused), ``trees/`` (the unpacked
projects). The set is built in ``.building/`` and replaces the previous one only once it is whole: a
build that fails leaves the previous set as it was. Bad options exit 2 before anything is created.
The same pins, seed and options give the same records (commits use fixed authors and dates).
"""

from __future__ import annotations

import argparse
import ast
import configparser
import hashlib
import json
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FIXED_DATE = "2024-01-01T00:00:00Z"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "harnessrl",
    "GIT_AUTHOR_EMAIL": "harnessrl@localhost",
    "GIT_COMMITTER_NAME": "harnessrl",
    "GIT_COMMITTER_EMAIL": "harnessrl@localhost",
    "GIT_AUTHOR_DATE": FIXED_DATE,
    "GIT_COMMITTER_DATE": FIXED_DATE,
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/nonexistent",
}
DROPPED = ("PKG-INFO", "setup.cfg~")  # build leftovers at the top of an sdist
TEST_TIMEOUT_S = 120


def load_projects(path: Path = HERE / "projects.toml") -> dict[str, dict[str, Any]]:
    return tomllib.loads(path.read_text())


def load_config(path: Path) -> dict[str, Any]:
    from harnessrl.config import load_raw_config, resolve_relative_paths

    return resolve_relative_paths(load_raw_config(str(path), [], env={}), path.resolve().parent)


# --------------------------------------------------------------------------------------------------
# The repository: a pinned sdist
# --------------------------------------------------------------------------------------------------


def fetch_sdist(name: str, spec: dict[str, Any], folder: Path) -> Path:
    """The project's sdist, downloaded once with pip and checked against its pinned sha256."""
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob(f"{name}-{spec['version']}.tar.gz"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
            + ["--no-build-isolation", "-d", str(folder), f"{name}=={spec['version']}"],
            check=True,
        )
        found = sorted(folder.glob(f"{name}-{spec['version']}.tar.gz"))
    if not found:
        raise SystemExit(f"make_tasks: pip did not download {name} {spec['version']} as an sdist")
    digest = hashlib.sha256(found[0].read_bytes()).hexdigest()
    if digest != spec["sha256"]:
        raise SystemExit(f"make_tasks: {found[0].name} has sha256 {digest}, pinned {spec['sha256']}")
    return found[0]


def clean_tree(sdist: Path, spec: dict[str, Any], dest: Path) -> Path:
    """The sdist unpacked into ``dest`` without build leftovers, with the project's pytest.ini."""
    if dest.exists():
        shutil.rmtree(dest)
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(sdist) as tar:
        tar.extractall(tmp, filter="data")
        [top] = list(Path(tmp).iterdir())
        shutil.copytree(top, dest)
    for path in sorted(dest.rglob("*"), reverse=True):
        if path.name.endswith(".egg-info") or path.name == "__pycache__":
            shutil.rmtree(path)
        elif path.suffix == ".pyc" or (path.parent == dest and path.name in DROPPED):
            path.unlink()
    (dest / "pytest.ini").write_text(spec["pytest_ini"])
    return dest


def test_paths(spec: dict[str, Any]) -> list[str]:
    ini = configparser.ConfigParser()
    ini.read_string(spec["pytest_ini"])
    return ini.get("pytest", "testpaths", fallback=".").split()


def test_files(tree: Path, spec: dict[str, Any]) -> list[str]:
    """Every file of the suite (relative paths): what the scorer restores before it runs."""
    files = []
    for rel in test_paths(spec):
        path = tree / rel
        if path.is_file():
            files.append(rel)
        else:
            files += [p.relative_to(tree).as_posix() for p in sorted(path.rglob("*")) if p.is_file()]
    return sorted(set(files) | {"pytest.ini"})


# --------------------------------------------------------------------------------------------------
# Running the suite inside the project's image
# --------------------------------------------------------------------------------------------------


class NoReport(Exception):
    """pytest finished without writing its report: the sandbox did not start, or pytest crashed."""

    def __init__(self, code: int, output: str):
        super().__init__(f"pytest exited {code} without a report:\n{output[-2000:]}")


@dataclass
class Outcome:
    status: str  # passed | failed | skipped | missing
    message: str = ""


class ImageRunner:
    """Runs commands in harnessrl's sandbox over one image (no network, its own /tmp). ``root`` gives
    the image's root for each run: ``Environments.root`` mounts the image again when another process
    on the same store unmounted it meanwhile."""

    def __init__(self, root: Callable[[], Any], scratch: Path):
        self.root = root
        self.scratch = scratch

    def run(self, argv: list[str], folder: Path, timeout_s: float = TEST_TIMEOUT_S) -> tuple[int | None, str]:
        from harnessrl.sandbox.bwrap import python_install_paths
        from harnessrl.sandbox.host import LAUNCHER_ENV, shared_host

        out = self.scratch / "out"
        out.mkdir(parents=True, exist_ok=True)
        spec = self.scratch / "spec.json"
        command = shared_host().launch_argv(
            spec,
            sandbox="bwrap",
            command=argv,
            cwd=folder,
            env={"HOME": str(out), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"},
            writable=(folder, out),
            read_only=python_install_paths(),
            network="none",
            root=self.root(),
            venv_on_path=False,
        )
        try:
            done = subprocess.run(
                command, env=LAUNCHER_ENV, capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            return None, ""
        return done.returncode, done.stdout + done.stderr

    def pytest(self, folder: Path, *args: str) -> tuple[int | None, str]:
        base = ["python3", "-B", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", "pytest.ini"]
        return self.run([*base, "--rootdir", ".", "-o", "addopts=", *args], folder)

    def collect(self, folder: Path) -> list[str]:
        code, output = self.pytest(folder, "--collect-only")
        ids = [line.strip() for line in output.splitlines() if "::" in line and not line.startswith(" ")]
        if code not in (0, 5) or not ids:
            raise SystemExit(f"make_tasks: collecting the tests of {folder} failed:\n{output[-2000:]}")
        return ids

    def outcomes(self, folder: Path, ids: list[str]) -> dict[str, Outcome] | None:
        """Each test's outcome, run inside the image; None if the run hung (``NoReport`` if it
        ended without a report: that is not a hang, and not the code's verdict either)."""
        from harnessrl.tasks.pytest_scoring import junit_key

        report = self.scratch / "out" / "junit.xml"
        report.unlink(missing_ok=True)
        code, output = self.pytest(folder, "--junitxml", str(report))
        if code is None:
            return None
        if not report.is_file():
            raise NoReport(code, output)
        cases: dict[tuple[str, str], Outcome] = {}
        for case in ET.parse(report).getroot().iter("testcase"):
            failure = case.find("failure")
            if failure is None:
                failure = case.find("error")
            key = (case.get("classname", ""), case.get("name", ""))
            if failure is not None:
                message = (failure.get("message") or failure.text or "").strip()
                cases[key] = Outcome("failed", message)
            elif case.find("skipped") is not None:
                cases.setdefault(key, Outcome("skipped"))
            else:
                cases.setdefault(key, Outcome("passed"))
        return {i: cases.get(junit_key(i), Outcome("missing")) for i in ids}


# --------------------------------------------------------------------------------------------------
# Bugs
# --------------------------------------------------------------------------------------------------


def functions_of(source: str) -> list[ast.FunctionDef]:
    return [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)]


def candidates(tree: Path, spec: dict[str, Any], rng: random.Random) -> list[tuple[str, str, Any]]:
    """``(module, function, mutant)`` for every verified mutant, in a seeded order."""
    from harnessrl.tasks.coding.mutations import mutants

    found = []
    for module in spec["modules"]:
        source = (tree / module).read_text()
        for function in functions_of(source):
            for mutant in mutants(source, function.name):
                found.append((module, function.name, mutant))
    rng.shuffle(found)
    return found


def first_line(text: str, limit: int = 300) -> str:
    line = next((x.strip() for x in text.splitlines() if x.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def problem_statement(
    project: str, version: str, module: str, function: str, source: str, failing: str, message: str
) -> str:
    node = next(f for f in functions_of(source) if f.name == function)
    doc = ast.get_docstring(node) or ""
    parts = [
        f"`{function}` in `{module}` ({project} {version}) has a bug. Running the project's tests, "
        f"`{failing}` fails:\n\n    {first_line(message) or 'the test fails'}"
    ]
    if doc:
        doc = "\n".join(doc.splitlines()[:12])
        parts.append(f"What `{function}` should do (its docstring):\n\n{textwrap.indent(doc, '    ')}")
    parts.append(
        f"Fix `{function}` in `{module}` so that the project's tests pass again. Do not change the tests."
    )
    return "\n\n".join(parts)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def make_repo(repo: Path, tree: Path, module: str, buggy: str, message: tuple[str, str]) -> tuple[str, str]:
    """A repository: the project, then the bug; returns (HEAD commit, gold patch)."""
    if repo.exists():
        shutil.rmtree(repo)
    shutil.copytree(tree, repo)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message[0])
    (repo / module).write_text(buggy)
    git(repo, "commit", "-q", "-am", message[1])
    return git(repo, "rev-parse", "HEAD"), git(repo, "diff", "HEAD", "HEAD~1") + "\n"


def line_fix(gold: str, buggy: str) -> list[list[Any]] | None:
    """The gold fix as ``[[line number, gold line], ...]``; None if the bug changed the line count."""
    a, b = gold.splitlines(keepends=True), buggy.splitlines(keepends=True)
    if len(a) != len(b):
        return None
    return [[i + 1, x] for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]


# --------------------------------------------------------------------------------------------------
# Confirmation through the example's own scorer
# --------------------------------------------------------------------------------------------------


def scorer(config: dict[str, Any]):
    from harnessrl.controller.evaluators import build_evaluator
    from harnessrl.controller.evaluators.command import EvaluatorSandbox

    return build_evaluator(config["evaluator"], validate=True, sandbox=EvaluatorSandbox("bwrap"))


def score(evaluator: Any, record: dict[str, Any], root: Any, workspace: Path) -> Any:
    import asyncio

    from harnessrl.controller.evaluators import EvaluationInput
    from harnessrl.data.records import to_task

    task = to_task(record)
    inp = EvaluationInput(
        task=task, workspace=workspace, rollout_id=f"build-{task['task_id']}", environment=root
    )
    return asyncio.run(evaluator.evaluate(inp))


def workspace_of(repo: Path, folder: Path) -> Path:
    from harnessrl.sandbox.workspace import prepare_workspace

    if folder.exists():
        shutil.rmtree(folder)
    prepare_workspace(folder, repo=repo, files={}, git_history="squash")
    return folder


# --------------------------------------------------------------------------------------------------
# The build
# --------------------------------------------------------------------------------------------------


def build_project(
    name: str,
    spec: dict[str, Any],
    *,
    out: Path,
    stage: Path,
    config: dict[str, Any],
    environments: Any,
    per_project: int,
    seed: int,
    report: dict[str, Any],
) -> list[dict[str, Any]]:
    env_name = f"swe/{name}"
    tree = clean_tree(fetch_sdist(name, spec, out / "sdists"), spec, out / "trees" / name)

    def root() -> Any:  # per run: mounted again if it was unmounted meanwhile
        return environments.root(env_name, where=f"project {name!r} (environment {env_name!r})")

    evaluator = scorer(config)
    stats = {"image": root().name, "tried": 0, "kept": 0, "unconfirmed": 0, "no_failure": 0, "all_fail": 0}
    stats.update(hung=0, retried=0, operators={})
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix=f"swe-{name}-") as tmp:
        runner = ImageRunner(root, Path(tmp) / "scratch")
        work = Path(tmp) / "work"
        shutil.copytree(tree, work)
        ids = runner.collect(work)

        def run_suite(what: str) -> dict[str, Outcome] | None:
            """The suite's outcomes on ``work``; a run that left no report is tried once more (pytest
            reports even a module that fails to import: a missing report is the sandbox's, e.g. an
            image another process unmounted), then ends the build rather than build another set."""
            try:
                try:
                    return runner.outcomes(work, ids)
                except NoReport:
                    stats["retried"] += 1
                    return runner.outcomes(work, ids)
            except NoReport as exc:
                raise SystemExit(f"make_tasks: {name}: {what}: {exc}") from None

        baseline = run_suite("the suite on the unmodified code")
        if baseline is None:
            raise SystemExit(f"make_tasks: {name}'s suite hung on the unmodified code")
        passing = [i for i in ids if baseline[i].status == "passed"]
        stats.update(tests=len(ids), baseline_passing=len(passing))
        used_functions: set[tuple[str, str]] = set()
        for module, function, mutant in candidates(tree, spec, random.Random(f"{seed}:{name}")):
            if len(records) >= per_project:
                break
            if (module, function) in used_functions:
                continue
            gold_source = (tree / module).read_text()
            fix = line_fix(gold_source, mutant.source)
            if not fix:
                continue
            stats["tried"] += 1
            (work / module).write_text(mutant.source)
            try:
                result = run_suite(f"the suite on the mutant {mutant.description} of {function}")
            finally:
                (work / module).write_text(gold_source)
            if result is None:
                stats["hung"] += 1
                continue
            fail_to_pass = [i for i in passing if result[i].status != "passed"]
            pass_to_pass = [i for i in passing if result[i].status == "passed"]
            if not fail_to_pass:
                stats["no_failure"] += 1
                continue
            if not pass_to_pass:
                stats["all_fail"] += 1
                continue
            iid = f"{name}__{spec['version']}.{function}.{mutant.operator}_{mutant.line}"
            repo = stage / "repos" / iid
            head, patch = make_repo(
                repo,
                tree,
                module,
                mutant.source,
                (f"Import {name} {spec['version']}", f"Refactor {function}"),
            )
            hidden = stage / "hidden" / iid / "files"
            for rel in test_files(tree, spec):
                (hidden / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(tree / rel, hidden / rel)
            first = fail_to_pass[0]
            record = {
                "instance_id": iid,
                "repo": f"pypi/{name}",
                "base_commit": head,
                "image_name": env_name,
                "problem_statement": problem_statement(
                    name, spec["version"], module, function, gold_source, first, result[first].message
                ),
                "FAIL_TO_PASS": fail_to_pass,
                "PASS_TO_PASS": pass_to_pass,
                "source": {
                    "project": name,
                    "version": spec["version"],
                    "module": module,
                    "function": function,
                },
                "hidden": {"repo_path": str(repo), "tests": str(stage / "hidden" / iid)},
            }
            # The real scorer, in a fresh sandbox over the image: the bug scores 0, the gold fix 1.
            buggy = score(evaluator, record, root(), workspace_of(repo, Path(tmp) / "ws-bug"))
            fixed_ws = workspace_of(repo, Path(tmp) / "ws-gold")
            (fixed_ws / module).write_text(gold_source)
            fixed = score(evaluator, record, root(), fixed_ws)
            out_bug = buggy.details.get("output", {})
            if (
                buggy.reward != 0.0
                or out_bug.get("pass_to_pass") != f"{len(pass_to_pass)}/{len(pass_to_pass)}"
                or fixed.reward != 1.0
            ):
                stats["unconfirmed"] += 1
                shutil.rmtree(repo)
                shutil.rmtree(stage / "hidden" / iid)
                continue
            # Where the task will live once the whole set is published (main moves it there).
            record["hidden"] = {"repo_path": str(out / "repos" / iid), "tests": str(out / "hidden" / iid)}
            gold = stage / "gold" / iid
            gold.mkdir(parents=True, exist_ok=True)
            (gold / "gold.patch").write_text(patch)
            (gold / "mutation.json").write_text(
                json.dumps(
                    {
                        "module": module,
                        "function": function,
                        "operator": mutant.operator,
                        "line": mutant.line,
                        "before": mutant.before,
                        "after": mutant.after,
                        "fix": fix,
                        "scores": {"bug": buggy.reward, "gold": fixed.reward},
                    },
                    indent=2,
                )
            )
            used_functions.add((module, function))
            records.append(record)
            stats["kept"] += 1
            stats["operators"][mutant.operator] = stats["operators"].get(mutant.operator, 0) + 1
    report["projects"][name] = stats
    return records


def gold_fix_policy(out: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    """A scripted policy (engine ``scripted:gold_fix.json``) that applies the task's gold fix: it
    looks its task up in ``$HARNESSRL_TASK`` (the harness's visible task), rewrites the changed
    lines, and submits. What every task scores when it is solvable and the scorer is right: 1."""
    fixes = {}
    for record in records:
        mutation = json.loads((out / "gold" / record["instance_id"] / "mutation.json").read_text())
        fixes[record["instance_id"]] = [mutation["module"], mutation["fix"]]
    program = (
        "import json, os\n"
        f"FIXES = json.loads({json.dumps(json.dumps(fixes))})\n"
        "module, lines = FIXES[json.loads(os.environ['HARNESSRL_TASK'])['instance_id']]\n"
        "text = open(module).read().splitlines(keepends=True)\n"
        "for number, line in lines:\n"
        "    text[number - 1] = line\n"
        "open(module, 'w').write(''.join(text))\n"
        "print('fixed', module)\n"
    )
    bash = lambda command: {  # noqa: E731
        "content": "Running a command.",
        "tool_calls": [{"name": "bash", "arguments": {"command": command}}],
    }
    return {
        "turns": [
            bash(f"python3 - <<'EOF'\n{program}EOF"),
            bash("git diff --stat"),
            bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
        ],
        "on_exhausted": "repeat_last",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--per-project", type=int, default=4, help="bugs (tasks) per project")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--projects", default="", help="comma-separated subset of projects.toml")
    parser.add_argument(
        "--config", type=Path, default=HERE / "train.toml", help="its [harness.environment] and [evaluator]"
    )
    args = parser.parse_args(argv)

    from pydantic import ValidationError

    from harnessrl.data.records import write_records
    from harnessrl.environments.config import EnvironmentConfig
    from harnessrl.environments.resolve import Environments
    from harnessrl.errors import ConfigError, HarnessRLError

    # Every input is checked before anything is created or removed (exit 2 naming the option).
    started = time.monotonic()
    projects = load_projects()
    wanted = [p for p in args.projects.split(",") if p] or list(projects)
    unknown = [p for p in wanted if p not in projects]
    if unknown:
        parser.error(f"--projects: unknown project {unknown[0]!r}; known: {sorted(projects)}")
    if args.per_project < 1:
        parser.error(f"--per-project: must be at least 1, got {args.per_project}")
    try:
        config = load_config(args.config)
        environment = (config.get("harness") or {}).get("environment")
        if not isinstance(environment, dict):
            raise ConfigError("it has no [harness.environment] table (the projects' images)")
        if not isinstance(config.get("evaluator"), dict):
            raise ConfigError("it has no [evaluator] table (the scorer that confirms each task)")
        env_config = EnvironmentConfig.model_validate(environment)
        for name in wanted:
            if f"swe/{name}" not in env_config.images:
                raise ConfigError(f'[harness.environment.images."swe/{name}"] is missing (project {name!r})')
        scorer(config)
    except (ConfigError, ValidationError) as exc:
        parser.error(f"--config {str(args.config)!r}: {exc}")

    out = args.out.resolve()
    # The new set is built beside the old one and replaces it only once it is whole: a build that
    # fails midway (no network, an image that does not build) leaves the previous set as it was.
    stage = out / ".building"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    environments = Environments(env_config)
    report: dict[str, Any] = {"seed": args.seed, "per_project": args.per_project, "projects": {}}
    records: list[dict[str, Any]] = []
    try:
        for name in wanted:
            records += build_project(
                name,
                projects[name],
                out=out,
                stage=stage,
                config=config,
                environments=environments,
                per_project=args.per_project,
                seed=args.seed,
                report=report,
            )
        policy = gold_fix_policy(stage, records)
        report.update(
            tasks=len(records),
            fail_to_pass=sum(len(r["FAIL_TO_PASS"]) for r in records),
            pass_to_pass=sum(len(r["PASS_TO_PASS"]) for r in records),
            seconds=round(time.monotonic() - started, 1),
        )
        for folder in ("repos", "hidden", "gold"):
            shutil.rmtree(out / folder, ignore_errors=True)
            (stage / folder).mkdir(exist_ok=True)
            (stage / folder).rename(out / folder)
        write_records(out / "tasks.jsonl", records)
        (out / "gold_fix.json").write_text(json.dumps(policy, indent=1))
        (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    except HarnessRLError as exc:
        print(f"make_tasks: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        environments.close()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
