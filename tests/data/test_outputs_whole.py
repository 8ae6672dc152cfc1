"""``harnessrl data`` outputs when writing fails part-way (a full disk; here a file size limit, the
same ``OSError`` from ``write``): every output stays as it was, no temp file is left beside it, and
the error is one line naming the file, exit 2. ``split`` used to write its train set, then fail on
the test set: a new train set next to the old test set (records on both sides), a traceback and a
hidden ``.test.jsonl.PID.tmp`` left behind."""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
from pathlib import Path

from tests.data.generate import raw_records

from harnessrl.data.records import write_records


def run_limited(args: list[str], cwd: Path, max_file_bytes: int) -> subprocess.CompletedProcess[str]:
    """``harnessrl ARGS`` in a process that may write files of at most ``max_file_bytes`` (a write
    past it fails with EFBIG, as on a full disk, instead of the default SIGXFSZ kill)."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))

    return subprocess.run(
        [sys.executable, "-m", "harnessrl", *args],
        cwd=cwd,
        preexec_fn=limit,
        capture_output=True,
        text=True,
        timeout=120,  # only ends a hung test
    )


def test_a_split_that_cannot_write_its_test_set_leaves_both_sets_as_they_were(tmp_path: Path):
    records = raw_records()[:200]
    write_records(tmp_path / "in.jsonl", records)
    old_train = write_records(tmp_path / "train.jsonl", [{"old": "train"}]).read_bytes()
    old_test = write_records(tmp_path / "test.jsonl", [{"old": "test"}]).read_bytes()
    # 150 records to test, 50 to train: the limit lets any train set through, and no test set.
    sizes = sorted(len(json.dumps(r, ensure_ascii=False)) + 1 for r in records)
    largest_train, smallest_test = sum(sizes[-50:]), sum(sizes[:150])
    assert largest_train < smallest_test
    limit = (largest_train + smallest_test) // 2
    args = ["data", "split", "in.jsonl", "--train", "train.jsonl", "--test", "test.jsonl"]
    proc = run_limited([*args, "--test-size", "150", "--seed", "0"], tmp_path, limit)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "cannot write test.jsonl" in proc.stderr, proc.stderr
    assert (tmp_path / "train.jsonl").read_bytes() == old_train
    assert (tmp_path / "test.jsonl").read_bytes() == old_test
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "test.jsonl", "train.jsonl"]

    # The control: with room to write, the same command writes both.
    proc = run_limited([*args, "--test-size", "150", "--seed", "0"], tmp_path, 64 * 1024 * 1024)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len((tmp_path / "test.jsonl").read_text().splitlines()) == 150


def test_a_filter_that_cannot_write_out_or_its_report_says_so_in_one_line(tmp_path: Path):
    write_records(tmp_path / "raw.jsonl", raw_records())
    old = write_records(tmp_path / "out.jsonl", [{"old": 1}]).read_bytes()
    proc = run_limited(["data", "filter", "raw.jsonl", "out.jsonl"], tmp_path, 4096)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "cannot write out.jsonl" in proc.stderr, proc.stderr
    assert (tmp_path / "out.jsonl").read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "raw.jsonl"]
