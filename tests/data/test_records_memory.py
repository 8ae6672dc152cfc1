"""Reading a big record file holds the records, not the file as well: ``read_records`` read the whole
file, split it into lines and then built the records, three copies of a 2 GB export at once; and
``filter``, which keeps few of them, held every record it read. Measured with ``tracemalloc`` as a
ratio to the file's size."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from harnessrl.cli.data import app
from harnessrl.data.records import read_appended_records, read_records

RECORDS = 200
STATEMENT = 20_000  # characters per record: the file is about 4 MB, almost all of it statements


def big_file(tmp_path: Path, *, image: bool = True) -> Path:
    path = tmp_path / "raw.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        for i in range(RECORDS):
            record = {
                "instance_id": f"r{i}",
                "problem_statement": f"{i} " + "x" * STATEMENT,
                "base_commit": "abc",
                "FAIL_TO_PASS": ["t"],
                **({"image_name": "img"} if image else {}),
            }
            fh.write(json.dumps(record) + "\n")
    return path


def peak_bytes(work: Callable[[], Any]) -> int:
    """The most memory ``work`` held at once, above what was held before it."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        result = work()
        peak = tracemalloc.get_traced_memory()[1] - before
        del result
    finally:
        tracemalloc.stop()
    return peak


def test_reading_records_holds_about_the_records_not_the_file_too(tmp_path: Path) -> None:
    path = big_file(tmp_path)
    size = path.stat().st_size
    records = read_records(path)
    assert len(records) == RECORDS and records[7]["problem_statement"].startswith("7 ")
    assert peak_bytes(lambda: read_records(path)) < 1.5 * size  # the records themselves: about 1x
    assert peak_bytes(lambda: read_appended_records(path)) < 1.5 * size


def test_filter_holds_the_records_it_keeps_not_those_it_drops(tmp_path: Path) -> None:
    path = big_file(tmp_path, image=False)  # every record dropped: missing_image
    out = tmp_path / "kept.jsonl"
    result = CliRunner().invoke(app, ["filter", str(path), str(out)])
    assert result.exit_code == 0, result.output
    assert read_records(out) == []
    assert json.loads(result.stdout.strip().splitlines()[-1])["dropped"]["missing_image"] == RECORDS
    peak = peak_bytes(lambda: CliRunner().invoke(app, ["filter", str(path), str(out)]))
    assert peak < 0.25 * path.stat().st_size  # a record at a time, not the file
