"""``split`` never puts one task (or one project) on both sides, and ``filter`` sees copies of
one statement that differ only in whitespace, case or Unicode form as one statement."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harnessrl.data.curate import filter_records, split_records
from harnessrl.data.records import normalized_statement, write_records

# One statement written five ways: composed "é", decomposed "é", a full-width "Ｃ" with a no-break
# space, a zero-width space inside a word, and extra whitespace and capitals.
VARIANTS = (
    "Café crashes on empty input",
    "Cafe\u0301 crashes on empty input",
    "\uff23af\u00e9\u00a0crashes on empty input",
    "Caf\u200b\u00e9 crashes on empty input",
    "CAFÉ   crashes\non EMPTY input",
)


def task(repo: str, index: int, statement: str) -> dict:
    return {
        "instance_id": f"{repo}.func_pm_{index:04d}",
        "repo": f"swesmith/{repo}.0",
        "image_name": "swesmith.x86_64",
        "base_commit": f"{index:040x}",
        "problem_statement": statement,
        "FAIL_TO_PASS": [f"tests/test_{index}.py::test_bug"],
    }


def leaky_records() -> list[dict]:
    """20 distinct tasks, the five variants of one statement (each in a repository of its own) and a
    second copy of one instance."""
    records = [task(f"o__p{i}", i, f"Distinct issue number {i}") for i in range(20)]
    records += [task(f"v__p{i}", 100 + i, text) for i, text in enumerate(VARIANTS)]
    records.append(dict(records[3]))  # the same instance twice
    return records


def assert_no_task_on_both_sides(train: list[dict], test: list[dict]) -> None:
    for key in ("instance_id", "problem_statement"):
        norm = normalized_statement if key == "problem_statement" else (lambda r: r["instance_id"])
        both = {norm(r) for r in train} & {norm(r) for r in test}
        assert not both, f"{key} on both sides: {both}"


def test_split_keeps_every_copy_of_a_task_on_one_side():
    records = leaky_records()
    for no_repo_leakage in (False, True):
        for seed in range(12):
            train, test, report = split_records(
                records, test_size=8, seed=seed, no_repo_leakage=no_repo_leakage
            )
            assert_no_task_on_both_sides(train, test)
            assert len(train) + len(test) == len(records) and report["duplicates"] == 5


def test_split_of_duplicates_is_the_same_bytes_under_any_hash_seed(tmp_path: Path):
    source = tmp_path / "in.jsonl"
    write_records(source, leaky_records())
    outputs = []
    for hash_seed in ("0", "1"):
        train, test = tmp_path / f"train{hash_seed}.jsonl", tmp_path / f"test{hash_seed}.jsonl"
        proc = subprocess.run(
            [sys.executable, "-m", "harnessrl", "data", "split", str(source), "--train", str(train),
             "--test", str(test), "--test-size", "8", "--seed", "5"],
            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONHASHSEED": hash_seed},
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout.splitlines()[-1])["duplicates"] == 5
        outputs.append((train.read_bytes(), test.read_bytes()))
        assert_no_task_on_both_sides(
            [json.loads(line) for line in train.read_text().splitlines()],
            [json.loads(line) for line in test.read_text().splitlines()],
        )
    assert outputs[0] == outputs[1]


def test_filter_drops_unicode_variants_of_one_statement():
    records = [task(f"v__p{i}", i, t) for i, t in enumerate(VARIANTS)]
    kept, report = filter_records(records, dedupe_statements=True)
    assert [r["problem_statement"] for r in kept] == [VARIANTS[0]]
    assert report["dropped"]["duplicate_problem_statement"] == len(VARIANTS) - 1


def test_one_project_in_swesmith_and_swebench_form_stays_on_one_side():
    """A set mixing SWE-smith records (``swesmith/getmoto__moto.694ce1f4``) with SWE-bench / SWE-Gym
    ones (``getmoto/moto``, a GitHub URL) kept them as different repositories: ``--no-repo-leakage``
    put moto on both sides and reported ``repos_shared: 0``."""
    forms = ("swesmith/getmoto__moto.694ce1f4", "getmoto/moto", "https://github.com/getmoto/moto.git")
    records = [dict(task("x", i, f"Moto issue {i}"), repo=forms[i % 3]) for i in range(6)]
    records += [dict(task("x", 10 + i, f"Other issue {i}"), repo=f"owner{i}/other{i}") for i in range(6)]
    for seed in range(8):
        train, test, report = split_records(records, test_size=6, seed=seed, no_repo_leakage=True)
        moto_sides = {"train" for r in train if "Moto" in r["problem_statement"]}
        moto_sides |= {"test" for r in test if "Moto" in r["problem_statement"]}
        assert len(moto_sides) == 1, f"seed {seed}: moto on both sides"
        assert report["repos_shared"] == 0 and report["repos_train"] + report["repos_test"] == 7


def test_a_statement_of_invisible_characters_only_is_empty():
    """A problem statement of zero-width characters only is no statement (the harness's prompt
    would be blank): it was kept, and with ``--dedupe-statements`` every other one was dropped as
    its duplicate; it is ``empty_problem_statement`` now."""
    records = [task("z__p", 1, "\u200b\u2060"), task("z__q", 2, "\ufeff"), task("z__r", 3, "A real issue")]
    kept, report = filter_records(records, dedupe_statements=True)
    assert [r["problem_statement"] for r in kept] == ["A real issue"]
    assert report["dropped"]["empty_problem_statement"] == 2
    assert report["dropped"]["duplicate_problem_statement"] == 0
