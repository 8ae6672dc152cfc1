"""A record's test list written as a JSON string nested too deeply to decode: one clear error naming
the record and the field (``filter`` exits 2, ``to_task`` raises ``ConfigError``), never a
``RecursionError`` traceback. And a file saved with a byte order mark and CRLF line ends is read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.data.records import append_record, read_appended_records, read_records, to_task
from harnessrl.errors import ConfigError

HARNESSRL = [sys.executable, "-m", "harnessrl"]
DEEP = "[" * 100_000 + "]" * 100_000  # a JSON string json's decoder recurses 100,000 levels into


def record(instance_id: str, fail_to_pass: object) -> dict[str, object]:
    return {
        "instance_id": instance_id,
        "problem_statement": "Fix it.",
        "image_name": "img",
        "base_commit": "abc",
        "FAIL_TO_PASS": fail_to_pass,
    }


def run_filter(
    tmp_path: Path, records: list[dict[str, object]]
) -> tuple[subprocess.CompletedProcess[str], Path]:
    raw, out = tmp_path / "raw.jsonl", tmp_path / "out.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in records))
    proc = subprocess.run(
        [*HARNESSRL, "data", "filter", str(raw), str(out)], capture_output=True, text=True, timeout=120
    )
    return proc, out


def test_filter_names_a_test_list_nested_too_deeply_and_writes_nothing(tmp_path: Path) -> None:
    proc, out = run_filter(tmp_path, [record("good", '["t::a"]'), record("deep-one", DEEP)])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert (
        "'deep-one'" in proc.stderr and "FAIL_TO_PASS" in proc.stderr and "nested too deeply" in proc.stderr
    )
    assert not out.exists()


def test_filter_reads_a_json_string_test_list_as_before(tmp_path: Path) -> None:
    """The control: the same file without the deep list is filtered, its string list decoded."""
    proc, out = run_filter(tmp_path, [record("good", '["t::a"]'), record("empty", "[]")])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [json.loads(line)["instance_id"] for line in out.read_text().splitlines()] == ["good"]


@pytest.mark.parametrize("where", ["top", "hidden"])
def test_to_task_names_a_test_list_nested_too_deeply(where: str) -> None:
    """``to_task`` (a training run's swesmith task source, ``calibrate``) raised RecursionError."""
    rec = (
        record("deep-two", DEEP)
        if where == "top"
        else {"instance_id": "deep-two", "hidden": {"PASS_TO_PASS": DEEP}}
    )
    with pytest.raises(ConfigError, match=r"'deep-two'.*(FAIL_TO_PASS|PASS_TO_PASS).*nested too deeply"):
        to_task(rec)
    assert to_task(record("fine", '["t::b"]'))["hidden"]["FAIL_TO_PASS"] == ["t::b"]


def test_filter_reads_a_file_saved_with_a_byte_order_mark_and_crlf(tmp_path: Path) -> None:
    """A JSONL file saved by a Windows tool (a UTF-8 BOM, CRLF line ends): line 1 was refused as
    "not valid JSON: Unexpected UTF-8 BOM", exit 2, nothing curated. Read as the same records now,
    written back without the mark."""
    raw, out = tmp_path / "raw.jsonl", tmp_path / "out.jsonl"
    records = [record("first", ["t::a"]), record("second", ["t::b"])]
    raw.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\r\n" for r in records).encode())
    proc = subprocess.run(
        [*HARNESSRL, "data", "filter", str(raw), str(out)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1])["output"] == 2
    assert out.read_bytes() == "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()


def test_a_record_appended_after_a_last_line_without_its_newline_starts_its_own_line(tmp_path: Path) -> None:
    """A run killed after writing a record but before its newline leaves a whole last line that
    reads back: the next ``append_record`` (a resumed ``calibrate``) went on in that line, so neither
    record read back and every later resume stopped there with "not valid JSON"."""
    out = tmp_path / "out.jsonl"
    out.write_text(json.dumps(record("a", ["t"])))  # no "\n": the process died before it
    records, torn = read_appended_records(out)
    assert (len(records), torn) == (1, False)  # whole: nothing rewrites it
    append_record(out, record("b", ["t"]))
    assert [r["instance_id"] for r in read_appended_records(out)[0]] == ["a", "b"]
    append_record(out, record("c", ["t"]))
    assert [r["instance_id"] for r in read_records(out)] == ["a", "b", "c"]
