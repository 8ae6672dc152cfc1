"""A record whose string holds a lone surrogate escape (``"\\ud800"``: valid JSON, and ``json.loads``
reads it) passes through the data commands unchanged. Written raw, UTF-8 refused the character and
``filter``, ``select`` and ``split`` ended in a ``UnicodeEncodeError`` traceback (exit 1) with nothing
written; the line is now written with the escape, and reads back as the same record. The commands
run as a user runs them (the CLI in a subprocess)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from tests.data.generate import good_record

from harnessrl.data.records import read_records

HARNESSRL = [sys.executable, "-m", "harnessrl"]


def data_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HARNESSRL, "data", *args], capture_output=True, text=True, timeout=120)


def test_a_lone_surrogate_escape_passes_through_the_commands(tmp_path: Path) -> None:
    rng = random.Random(0)
    plain = [good_record(i, rng=rng) for i in range(4)]
    raw = tmp_path / "raw.jsonl"
    lines = [json.dumps(r) for r in plain]
    # Record 1's statement ends in a lone high surrogate escape, record 2 has a lone low one in a key.
    lines[1] = lines[1].replace('"problem_statement": "', '"problem_statement": "half an emoji \\ud83d ', 1)
    lines[2] = lines[2][:-1] + ', "note\\udc80": "x"}'
    raw.write_text("\n".join(lines) + "\n", encoding="utf-8")
    records = read_records(raw)
    assert "\ud83d" in records[1]["problem_statement"] and "note\udc80" in records[2]

    kept = tmp_path / "kept.jsonl"
    proc = data_cli("filter", str(raw), str(kept))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert read_records(kept) == records  # unchanged, the escapes included
    assert "\\ud83d" in kept.read_text(encoding="utf-8")

    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    proc = data_cli(
        "split", str(kept), "--train", str(train), "--test", str(test), "--test-size", "2", "--seed", "0"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    both = read_records(train) + read_records(test)
    assert sorted(both, key=lambda r: r["instance_id"]) == sorted(records, key=lambda r: r["instance_id"])
