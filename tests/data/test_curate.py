"""``harnessrl data filter | select | split`` on a generated task set with known defects: exact counts,
exact outputs, and the same bytes for the same seed. The commands are run as a user runs them."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from tests.data.generate import calibrated_records, good_record, raw_records

from harnessrl.data.curate import filter_records, select_records, split_records
from harnessrl.data.records import count_tests, read_records, repo_of, to_task, write_records
from harnessrl.data.records import tests_of as listed_tests  # not collected as a test

HARNESSRL = [sys.executable, "-m", "harnessrl"]


def data_cli(*args: str) -> dict:
    proc = subprocess.run([*HARNESSRL, "data", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ids(records: list[dict]) -> list[str]:
    return [r["instance_id"] for r in records]


def test_filter_counts_each_rule_exactly(tmp_path: Path):
    raw = tmp_path / "raw.jsonl"
    write_records(raw, raw_records())
    report = data_cli(
        "filter",
        str(raw),
        str(tmp_path / "kept.jsonl"),
        "--max-tests",
        "50",
        "--report",
        str(tmp_path / "r.json"),
    )
    assert report["input"] == 330 and report["output"] == 246
    assert report["dropped"] == {
        "missing_instance_id": 10,
        "empty_problem_statement": 20,  # 15 blank + 4 also missing the image + 1 shadowing copy
        "missing_image": 12,
        "missing_branch": 8,
        "no_fail_to_pass": 5,
        "too_many_tests": 20,
        "duplicate_instance": 9,
        "duplicate_problem_statement": 0,
    }
    assert json.loads((tmp_path / "r.json").read_text()) == report
    kept = read_records(tmp_path / "kept.jsonl")
    # Exactly the 240 good records and the 6 near-duplicates, in input order; good #0 survives its
    # broken first copy, and records with exactly 50 tests are kept.
    good = [r for r in raw_records() if r.get("instance_id", "").split(".")[-1].startswith("func_pm_0")]
    assert ids(kept) == list(dict.fromkeys(ids(good[1:]))) + [f"near-duplicate-{i}" for i in range(6)]
    assert kept[0]["problem_statement"]
    assert (
        max(
            len(to_task(r)["hidden"]["FAIL_TO_PASS"]) + len(to_task(r)["hidden"]["PASS_TO_PASS"])
            for r in kept
        )
        == 50
    )


def test_filter_can_drop_near_duplicate_statements():
    kept, report = filter_records(raw_records(), max_tests=50, dedupe_statements=True)
    assert report["output"] == 240 and report["dropped"]["duplicate_problem_statement"] == 6
    assert not any(i.startswith("near-duplicate") for i in ids(kept))
    _, unlimited = filter_records(raw_records())  # without --max-tests nothing is too large
    assert unlimited["dropped"]["too_many_tests"] == 0 and unlimited["output"] == 266


def test_to_task_maps_swe_smith_fields():
    record = raw_records()[1]  # good #0, test lists stored as JSON strings
    task = to_task({**record, "calibration": {"k": 4, "passes": 1}})
    assert task["task_id"] == record["instance_id"]
    assert task["prompt"] == record["problem_statement"]
    assert task["branch"] == record["base_commit"]
    # The test lists are the scorer's: decoded, and under hidden with every evaluator-only field.
    assert task["hidden"]["FAIL_TO_PASS"] == ["tests/test_mod0.py::test_bug_0"]
    assert isinstance(task["hidden"]["PASS_TO_PASS"], list) and "calibration" not in task
    assert "FAIL_TO_PASS" not in task and "PASS_TO_PASS" not in task
    assert task["image_name"] == record["image_name"] and task["repo"] == record["repo"]


def test_to_task_hides_the_gold_patch_from_the_harness():
    from harnessrl.controller.harness import harness_view
    from harnessrl.tasks.fields import check_visible

    record = {
        **raw_records()[1],
        "patch": "diff --git GOLD",
        "test_patch": "diff --git TESTS",
        "answer": "ANSWER",
        "hidden": {"repo_path": "/data/REPO"},  # a record's own hidden data is kept
    }
    task = to_task(record)
    assert {k: task["hidden"][k] for k in ("patch", "test_patch", "answer", "repo_path")} == {
        "patch": "diff --git GOLD",
        "test_patch": "diff --git TESTS",
        "answer": "ANSWER",
        "repo_path": "/data/REPO",
    }
    assert not {"patch", "test_patch", "answer"} & set(task)
    check_visible(task, where="to_task")  # what the swesmith task source checks
    seen = json.dumps(harness_view(task))
    assert not any(marker in seen for marker in ("GOLD", "TESTS", "ANSWER", "REPO", "test_bug_0"))


def test_to_task_keeps_the_test_lists_of_a_records_own_hidden_object():
    """A record already in task form (its tests under ``hidden``, none at the top) keeps them:
    they were replaced by empty lists, so the evaluator had no test to run."""
    record = {k: v for k, v in raw_records()[1].items() if k not in ("FAIL_TO_PASS", "PASS_TO_PASS")}
    record["hidden"] = {"FAIL_TO_PASS": '["tests/a.py::test_x"]', "PASS_TO_PASS": ["tests/a.py::test_y"]}
    task = to_task(record)
    assert task["hidden"]["FAIL_TO_PASS"] == ["tests/a.py::test_x"]
    assert task["hidden"]["PASS_TO_PASS"] == ["tests/a.py::test_y"]
    assert listed_tests(record, "FAIL_TO_PASS") == ["tests/a.py::test_x"] and count_tests(record) == 2
    # a top-level list still wins over the hidden one
    top = to_task({**record, "FAIL_TO_PASS": ["tests/b.py::test_z"]})
    assert top["hidden"]["FAIL_TO_PASS"] == ["tests/b.py::test_z"]


def test_to_task_refuses_a_hidden_that_is_no_object():
    """``dict(record["hidden"])`` raised ValueError/TypeError on a string or a number, and turned a
    list of pairs into an object; JSON null is still no hidden data."""
    import pytest

    from harnessrl.errors import ConfigError

    record = raw_records()[1]
    for bad in ("tests/x", 5, [["FAIL_TO_PASS", "tests/a.py::t"]]):
        with pytest.raises(ConfigError, match=r"'hidden' must be a JSON object"):
            to_task({**record, "hidden": bad})
    assert (
        to_task({**record, "hidden": None})["hidden"]["FAIL_TO_PASS"]
        == to_task(record)["hidden"]["FAIL_TO_PASS"]
    )


def test_a_json_null_test_list_is_no_tests():
    for value in (None, "null", "", " "):
        assert listed_tests({"FAIL_TO_PASS": value}, "FAIL_TO_PASS") == [], value
    assert listed_tests({"FAIL_TO_PASS": '["a"]'}, "FAIL_TO_PASS") == ["a"]
    assert listed_tests({"FAIL_TO_PASS": "tests/a.py::t"}, "FAIL_TO_PASS") == ["tests/a.py::t"]


def test_select_counts_a_damaged_calibration_as_uncalibrated():
    """A calibration no ``calibrate`` wrote (passes below 0 or above k, k below 1, a count that is a
    bool) is no measurement: passes -1 of 4 was counted as mixed and selected for training."""
    base = good_record(0, rng=random.Random(0))
    damaged = [(-1, 4), (5, 4), (0, 0), (-2, -1), (True, 4), (1, True)]
    records = [
        {**base, "instance_id": f"d{i}", "calibration": {"k": k, "passes": p}}
        for i, (p, k) in enumerate(damaged)
    ]
    records.append({**base, "instance_id": "ok", "calibration": {"k": 4, "passes": 2}})
    kept, report = select_records(records, unsolvable=10, seed=0)
    assert [r["instance_id"] for r in kept] == ["ok"]
    assert (report["uncalibrated"], report["mixed"], report["never_solved"], report["always_solved"]) == (
        6,
        1,
        0,
        0,
    )


def test_select_keeps_mixed_and_adds_seeded_unsolvable(tmp_path: Path):
    path = tmp_path / "cal.jsonl"
    write_records(path, calibrated_records())
    report = data_cli("select", str(path), str(tmp_path / "sel.jsonl"), "--unsolvable", "5", "--seed", "7")
    assert {k: report[k] for k in ("input", "output", "mixed", "never_solved", "always_solved")} == {
        "input": 65,
        "output": 41,
        "mixed": 36,
        "never_solved": 12,
        "always_solved": 12,
    }
    assert report["uncalibrated"] == 3 and report["infra_failed"] == 2 and report["unsolvable_added"] == 5
    selected = read_records(tmp_path / "sel.jsonl")
    assert [ids([r]) for r in selected if r["calibration"]["passes"] == 0] == [
        ["owner0__project0.00000000.func_pm_0000"],
        ["owner0__project0.00000000.func_pm_0005"],
        ["owner0__project0.00000000.func_pm_0010"],
        ["owner1__project1.00000001.func_pm_0025"],
        ["owner1__project1.00000001.func_pm_0030"],
    ]
    assert all(0 < r["calibration"]["passes"] < 4 for r in selected if r["calibration"]["passes"])
    again, _ = select_records(calibrated_records(), unsolvable=5, seed=7)
    assert again == selected
    other, _ = select_records(calibrated_records(), unsolvable=5, seed=8)
    assert ids(other) != ids(selected)
    everything, report = select_records(calibrated_records(), unsolvable=100, seed=0)
    assert report["unsolvable_added"] == 12 and len(everything) == 48


def test_split_by_count_and_without_repo_leakage(tmp_path: Path):
    kept, _ = filter_records(raw_records(), max_tests=50)
    path = tmp_path / "kept.jsonl"
    write_records(path, kept)
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    report = data_cli(
        "split", str(path), "--train", str(train), "--test", str(test), "--test-size", "40", "--seed", "3"
    )
    assert (report["train"], report["test"], report["repos_shared"]) == (206, 40, 12)
    test_records = read_records(test)
    assert ids(test_records)[:3] == [
        "owner0__project0.00000000.func_pm_0003",
        "owner0__project0.00000000.func_pm_0016",
        "owner1__project1.00000001.func_pm_0033",
    ]
    assert sorted(ids(read_records(train)) + ids(test_records)) == sorted(ids(kept))

    report = data_cli(
        "split", str(path), "--train", str(train), "--test", str(test), "--test-size", "40", "--seed", "3",
        "--no-repo-leakage",
    )  # fmt: skip
    assert (report["train"], report["test"], report["repos_test"], report["repos_shared"]) == (206, 40, 2, 0)
    test_repos = {repo_of(r) for r in read_records(test)}
    assert test_repos == {"owner1__project1", "owner7__project7"}
    assert not test_repos & {repo_of(r) for r in read_records(train)}
    # 30 cannot be met with whole repositories of 20 (and 26): the test set comes out smaller.
    _, small, report = split_records(kept, test_size=30, seed=3, no_repo_leakage=True)
    assert len(small) == report["test"] == 20 and report["repos_shared"] == 0


def test_bad_input_is_one_clear_line(tmp_path: Path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instance_id": "a"}\nnot json\n')
    proc = subprocess.run(
        [*HARNESSRL, "data", "filter", str(bad), str(tmp_path / "out.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "bad.jsonl:2" in proc.stderr


def test_a_line_nested_too_deeply_is_one_clear_line_too(tmp_path: Path):
    """json's decoder recurses per level: ``[[[[...`` was a RecursionError traceback (exit 1)."""
    bad = tmp_path / "deep.jsonl"
    bad.write_text('{"instance_id": "a"}\n' + "[" * 100_000 + "\n")
    out = tmp_path / "out.jsonl"
    proc = subprocess.run(
        [*HARNESSRL, "data", "filter", str(bad), str(out)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "deep.jsonl:2: nested too deeply" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


#: What ``str.splitlines`` takes for a line end besides "\n" and "\r" (``json.dumps`` escapes the ASCII
#: ones; U+0085, U+2028 and U+2029 stay raw with ensure_ascii=False).
LINE_SEPARATORS = ["\u2028", "\u2029", "\u0085", "\x1c", "\x1d", "\x1e", "\x0b", "\x0c"]


def test_records_keep_unicode_line_separators_in_their_strings(tmp_path: Path):
    """A problem statement holding U+2028, U+2029, U+0085... (written raw: ensure_ascii=False) reads
    back as one record, and the commands read each other's output."""
    from typer.testing import CliRunner

    from harnessrl.cli.data import app

    rng = random.Random(0)
    records = [
        {**good_record(i, rng=rng), "problem_statement": f"Bug {i}: one{sep}two"}
        for i, sep in enumerate(LINE_SEPARATORS)
    ]
    path = write_records(tmp_path / "raw.jsonl", records)
    assert any(sep in path.read_text(encoding="utf-8") for sep in LINE_SEPARATORS)  # raw, not escaped
    assert read_records(path) == records
    runner = CliRunner()
    kept = tmp_path / "kept.jsonl"
    result = runner.invoke(app, ["filter", str(path), str(kept)])
    assert result.exit_code == 0, result.output
    assert read_records(kept) == records
    split = ["split", str(kept), "--train", str(tmp_path / "a.jsonl"), "--test", str(tmp_path / "b.jsonl")]
    result = runner.invoke(app, [*split, "--test-size", "3", "--seed", "0"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["train"] == 5
    # "\r\n" line ends (a file edited on Windows) still read as line ends
    crlf = tmp_path / "crlf.jsonl"
    crlf.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    assert read_records(crlf) == records
