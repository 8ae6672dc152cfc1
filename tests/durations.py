"""Rewrite ``tests/durations.json`` (and the table in ``tests/DURATIONS.md``) from a pytest run.

    .venv/bin/pytest --durations=0 | tee /tmp/pytest.log     # or HARNESSRL_TEST_LOG=/tmp/pytest.log
    .venv/bin/python tests/durations.py /tmp/pytest.log

``durations.json`` maps each test that took at least ``MIN_S`` seconds (setup + call + teardown) to
its seconds; ``tests/conftest.py`` hands the longest tests and groups to the workers first. Times
from a loaded machine are too high, but their order is what matters.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
MIN_S = 1.0
LINE = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S.*)$")  # --durations
LOGGED = re.compile(r"^(\d+(?:\.\d+)?)\t(setup|call|teardown)\t\w+\t(\S.*)$")  # HARNESSRL_TEST_LOG


def parse(log: str) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for line in log.splitlines():
        match = LINE.match(line.strip()) or LOGGED.match(line.rstrip("\n"))
        if match:  # "tests/x.py::test@vllm": xdist's group suffix is not part of the test's id
            seconds[match.group(3).split("@")[0]] += float(match.group(1))
    return dict(seconds)


def main(path: str) -> None:
    seconds = parse(Path(path).read_text(errors="replace"))
    kept = {k: round(v, 1) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1]) if v >= MIN_S}
    (HERE / "durations.json").write_text(json.dumps(kept, indent=0) + "\n")
    by_folder: dict[str, float] = defaultdict(float)
    for nodeid, s in seconds.items():
        by_folder["/".join(nodeid.split("::")[0].split("/")[:2])] += s
    print(
        f"{len(seconds)} tests, {sum(seconds.values()) / 60:.1f} test-minutes; {len(kept)} kept (>= {MIN_S} s)"
    )
    for folder, s in sorted(by_folder.items(), key=lambda kv: -kv[1]):
        print(f"| `{folder}` | {s / 60:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1])
