"""``filter``, ``select`` and ``split``: pure functions from records to records plus a report.

They follow the SWE-smith recipe (raw tasks → drop broken ones → keep those the base policy solves
sometimes, plus a share it never solves → train/test). Everything is deterministic: the same input
and seed give the same output, byte for byte, and every dropped record is counted under one rule.
``calibrate`` (which runs rollouts) lives in ``harnessrl.data.calibrate``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable
from typing import Any

from harnessrl.data.records import (
    Record,
    branch_ref,
    count_tests,
    instance_id,
    normalized_statement,
    repo_of,
    tests_of,
    text_field,
)
from harnessrl.errors import ConfigError

# The order rules are checked in; a record failing several is counted under the first only.
# Duplicates come last so that a broken first copy never shadows a good later one.
FILTER_RULES = (
    "missing_instance_id",
    "empty_problem_statement",
    "missing_image",
    "missing_branch",
    "no_fail_to_pass",
    "too_many_tests",
    "duplicate_instance",
    "duplicate_problem_statement",
)


def _first_failed_rule(record: Record, max_tests: int | None) -> str | None:
    """The first non-duplicate rule ``record`` fails, or ``None``."""
    if not instance_id(record):
        return "missing_instance_id"
    if not normalized_statement(record):  # invisible characters only (a zero-width space) are empty too
        return "empty_problem_statement"
    if not text_field(record, "image_name"):
        return "missing_image"
    if not branch_ref(record):
        return "missing_branch"
    if not tests_of(record, "FAIL_TO_PASS"):  # nothing would tell a fix from no fix
        return "no_fail_to_pass"
    if max_tests is not None and count_tests(record) > max_tests:
        return "too_many_tests"
    return None


def filter_records(
    records: Iterable[Record], *, max_tests: int | None = None, dedupe_statements: bool = False
) -> tuple[list[Record], dict[str, Any]]:
    """Drop broken and duplicate records; the report counts each rule (all rules always listed).
    ``records`` is read once, in order (``iter_records``): only the kept ones are held."""
    if max_tests is not None and max_tests < 0:  # would drop every record, silently
        raise ConfigError(f"filter: --max-tests must be >= 0, got {max_tests}")
    kept: list[Record] = []
    dropped: Counter[str] = Counter({rule: 0 for rule in FILTER_RULES})
    seen_ids: set[str] = set()
    seen_statements: set[str] = set()
    read = 0
    for record in records:
        read += 1
        rule = _first_failed_rule(record, max_tests)
        if rule is None and instance_id(record) in seen_ids:
            rule = "duplicate_instance"
        if rule is None and dedupe_statements and normalized_statement(record) in seen_statements:
            rule = "duplicate_problem_statement"
        if rule is not None:
            dropped[rule] += 1
            continue
        seen_ids.add(instance_id(record))
        seen_statements.add(normalized_statement(record))
        kept.append(record)
    report = {
        "command": "filter",
        "input": read,
        "output": len(kept),
        "dropped": {rule: dropped[rule] for rule in FILTER_RULES},
        "rules_order": list(FILTER_RULES),
        "max_tests": max_tests,
        "dedupe_statements": dedupe_statements,
    }
    return kept, report


def _calibration(record: Record) -> dict[str, Any] | None:
    """The record's calibration if its counts are ones ``calibrate`` writes (k >= 1 rollouts, 0 to k
    passes), else None (uncalibrated). A damaged one (passes -1 of 4) counted as mixed, and its task
    was selected for training as one with a learning signal."""
    value = record.get("calibration")
    if not isinstance(value, dict):
        return None
    k, passes = value.get("k"), value.get("passes")
    if any(isinstance(n, bool) or not isinstance(n, int) for n in (k, passes)):
        return None
    return value if 0 <= passes <= k and k >= 1 else None


def select_records(
    records: list[Record], *, unsolvable: int, seed: int
) -> tuple[list[Record], dict[str, Any]]:
    """Keep tasks with mixed outcomes (``0 < passes < k``) and add ``unsolvable`` never-solved ones.

    Mixed tasks are where a group of rollouts carries a learning signal (rewards differ, so the
    advantages are not all zero). A few never-solved tasks keep the set from rewarding only what the
    base policy can already nearly do. Records whose calibration had infrastructure failures are
    left out (their pass count is not a measurement); re-run ``calibrate`` to measure them again.
    The output keeps the input order.
    """
    if unsolvable < 0:
        raise ConfigError("select: --unsolvable must be >= 0")
    counts: Counter[str] = Counter()
    mixed: set[int] = set()
    never: list[int] = []
    for index, record in enumerate(records):
        cal = _calibration(record)
        if cal is None:
            counts["uncalibrated"] += 1
        elif cal.get("infra_failures", 0):
            counts["infra_failed"] += 1
        elif cal["passes"] == 0:
            counts["never_solved"] += 1
            never.append(index)
        elif cal["passes"] >= cal["k"]:
            counts["always_solved"] += 1
        else:
            counts["mixed"] += 1
            mixed.add(index)
    # Sampling from the sorted index list makes the choice depend only on the input and the seed.
    chosen = set(random.Random(seed).sample(never, min(unsolvable, len(never))))
    kept = [record for index, record in enumerate(records) if index in mixed or index in chosen]
    report = {
        "command": "select",
        "input": len(records),
        "output": len(kept),
        "mixed": counts["mixed"],
        "never_solved": counts["never_solved"],
        "always_solved": counts["always_solved"],
        "uncalibrated": counts["uncalibrated"],
        "infra_failed": counts["infra_failed"],
        "unsolvable_requested": unsolvable,
        "unsolvable_added": len(chosen),
        "seed": seed,
    }
    return kept, report


def _split_units(records: list[Record], *, by_repo: bool) -> list[list[int]]:
    """The indices of records that must land on one side of a split, unit by unit (each in input
    order): records joined by one ``instance_id``, one normalized problem statement (whitespace,
    case and Unicode form aside) or, with ``by_repo``, one repository, directly or through others.
    A split that drew them one by one put a task on both sides, a leak a test score cannot show."""
    parent = list(range(len(records)))

    def root(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]  # path halving: long chains stay short
            index = parent[index]
        return index

    first_of: dict[tuple[str, str], int] = {}
    for index, record in enumerate(records):
        keys = [("instance", instance_id(record)), ("statement", normalized_statement(record))]
        if by_repo:
            keys.append(("repo", repo_of(record)))
        for key in keys:
            if not key[1]:  # a missing field joins nothing
                continue
            other = first_of.setdefault(key, index)
            parent[root(index)] = root(other)
    units: dict[int, list[int]] = {}
    for index in range(len(records)):
        units.setdefault(root(index), []).append(index)
    return list(units.values())


def _unit_name(records: list[Record], unit: list[int], by_repo: bool) -> str:
    """A name that orders units the same way on every run: its first repository by name (so that a
    repository split sorts exactly as it did before units joined duplicates), else its first index."""
    if by_repo:
        return min(repo_of(records[i]) or f"<no repo #{i}>" for i in unit)
    return f"{unit[0]:012d}"


def split_records(
    records: list[Record], *, test_size: int, seed: int, no_repo_leakage: bool = False
) -> tuple[list[Record], list[Record], dict[str, Any]]:
    """Split into train and test by count; both keep the input order.

    Plain: ``test_size`` records drawn with the seed. With ``no_repo_leakage`` whole repositories go
    to the test set (repositories in seeded random order, each taken if it still fits), so no
    repository appears on both sides; the test set can then come out smaller than asked (reported).
    A record without ``repo`` is its own repository.

    Either way records of one task (the same ``instance_id``, or the same problem statement after
    ``normalized_statement``) are never split up: they go to one side together, as a repository
    does, and the test set can come out smaller than asked (``duplicates`` in the report counts the
    records that had an earlier record of their task).
    """
    if test_size < 0 or test_size > len(records):
        raise ConfigError(f"split: --test-size must be between 0 and {len(records)}, got {test_size}")
    rng = random.Random(seed)
    groups: dict[str, list[int]] = {}
    for index, record in enumerate(records):
        key = repo_of(record) or f"<no repo #{index}>"
        groups.setdefault(key, []).append(index)
    task_units = _split_units(records, by_repo=False)
    duplicates = len(records) - len(task_units)
    if no_repo_leakage or duplicates:
        units = _split_units(records, by_repo=True) if no_repo_leakage else task_units
        by_name = {_unit_name(records, unit, no_repo_leakage): unit for unit in units}
        test: set[int] = set()
        for name in rng.sample(sorted(by_name), len(by_name)):
            if len(test) + len(by_name[name]) <= test_size:
                test.update(by_name[name])
            if len(test) == test_size:
                break
    else:  # every record its own task: drawn one by one, as always (the same seed, the same split)
        test = set(rng.sample(range(len(records)), test_size))
    train_out = [r for i, r in enumerate(records) if i not in test]
    test_out = [r for i, r in enumerate(records) if i in test]
    train_repos = {repo for repo, idx in groups.items() if any(i not in test for i in idx)}
    test_repos = {repo for repo, idx in groups.items() if any(i in test for i in idx)}
    report = {
        "command": "split",
        "input": len(records),
        "train": len(train_out),
        "test": len(test_out),
        "test_size_requested": test_size,
        "duplicates": duplicates,
        "repos_train": len(train_repos),
        "repos_test": len(test_repos),
        "repos_shared": len(train_repos & test_repos),
        "no_repo_leakage": no_repo_leakage,
        "seed": seed,
    }
    return train_out, test_out, report
