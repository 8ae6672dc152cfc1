"""A generated SWE-smith-style task set with known defects, for exact-count tests of ``harnessrl data``.

``raw_records()`` returns 330 records: 240 good ones in 12 repositories of 20, 6 near-duplicate
problem statements (new ids, same statement up to case and whitespace, in repository 0), and
defects, each breaking exactly the rule it is named after unless said otherwise:

=============================  =====  ===========================================================
rule (first failing)           count  how
=============================  =====  ===========================================================
missing_instance_id              10   no ``instance_id`` (5) or an empty one (5)
empty_problem_statement          20   15 empty/blank/None; 4 also lack ``image_name`` (counted
                                      here, the first rule); 1 is a broken first copy of good #0
missing_image                    12   no ``image_name``
missing_branch                    8   neither ``base_commit`` nor ``branch``
no_fail_to_pass                   5   ``FAIL_TO_PASS`` empty
too_many_tests                   20   51-80 tests (max 50); good records have 2-50
duplicate_instance                9   exact copies of good records, later in the file
=============================  =====  ===========================================================

With ``--max-tests 50``: 246 kept (240 + the 6 near-duplicates); with ``--dedupe-statements`` 240.
"""

from __future__ import annotations

import json
import random
from typing import Any

REPOS = [f"swesmith/owner{r}__project{r}.{r:08x}" for r in range(12)]


def good_record(index: int, *, rng: random.Random) -> dict[str, Any]:
    repo = REPOS[(index // 20) % len(REPOS)]
    name = repo.split("/", 1)[1]
    fail = [f"tests/test_mod{index}.py::test_bug_{j}" for j in range(1 + index % 3)]
    # Some records sit exactly on the limit (50 tests), which must be kept.
    n_pass = 50 - len(fail) if index % 40 == 7 else rng.randint(1, 40)
    passing = [f"tests/test_other{index}.py::test_ok_{j}" for j in range(n_pass)]
    record: dict[str, Any] = {
        "instance_id": f"{name}.func_pm_{index:04d}",
        "repo": repo,
        "image_name": f"jyangballin/swesmith.x86_64.{name.replace('__', '_1776_')}",
        "base_commit": f"{index:040x}",
        "problem_statement": f"Function number {index} returns the wrong value for empty input.",
        "patch": f"diff --git a/mod{index}.py b/mod{index}.py\n",
        "FAIL_TO_PASS": fail,
        "PASS_TO_PASS": passing,
    }
    if index % 3 == 0:  # Hugging Face exports store the lists as JSON strings
        record["FAIL_TO_PASS"] = json.dumps(fail)
        record["PASS_TO_PASS"] = json.dumps(passing)
    return record


def raw_records(seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    good = [good_record(i, rng=rng) for i in range(240)]
    defects: list[dict[str, Any]] = []

    def broken(i: int, **changes: Any) -> dict[str, Any]:
        record = good_record(1000 + i, rng=rng)
        record["repo"] = REPOS[i % 12]
        for key, value in changes.items():
            if value is KeyError:
                record.pop(key, None)
            else:
                record[key] = value
        return record

    defects += [broken(i, instance_id=KeyError) for i in range(5)]
    defects += [broken(5 + i, instance_id="") for i in range(5)]
    blanks = ["", "   ", None, "\n\t"]
    defects += [broken(10 + i, problem_statement=blanks[i % 4]) for i in range(15)]
    defects += [broken(25 + i, problem_statement="", image_name=KeyError) for i in range(4)]
    defects += [broken(29 + i, image_name=KeyError if i % 2 else "") for i in range(12)]
    defects += [broken(41 + i, base_commit=KeyError) for i in range(8)]
    defects += [broken(49 + i, FAIL_TO_PASS=[] if i % 2 else "[]") for i in range(5)]
    defects += [
        broken(54 + i, PASS_TO_PASS=[f"t::p{j}" for j in range(50 + i)], FAIL_TO_PASS=["t::f0"])
        for i in range(20)
    ]  # 51..70 tests
    near = []
    for i in range(6):  # same statement as good #i*3, other id
        record = dict(good[i * 3])
        record["instance_id"] = f"near-duplicate-{i}"
        record["problem_statement"] = "  " + record["problem_statement"].upper().replace(" ", "   ") + "\n"
        near.append(record)
    duplicates = [dict(good[i * 25]) for i in range(9)]
    shadow = dict(good[0], problem_statement="")  # a broken first copy must not shadow good #0
    return [shadow, *good, *near, *defects, *duplicates]


def calibrated_records() -> list[dict[str, Any]]:
    """65 records for ``select``: 60 with ``passes = i % 5`` of k=4 (12 never, 36 mixed, 12 always),
    3 uncalibrated, 2 with infrastructure failures."""
    rng = random.Random(1)
    out = []
    for i in range(60):
        record = good_record(i, rng=rng)
        passes = i % 5
        record["calibration"] = {"k": 4, "passes": passes, "rewards": [1.0] * passes + [0.0] * (4 - passes)}
        out.append(record)
    out += [good_record(60 + i, rng=rng) for i in range(3)]
    for i in range(2):
        record = good_record(63 + i, rng=rng)
        record["calibration"] = {"k": 4, "passes": 1, "infra_failures": 1}
        out.append(record)
    return out
