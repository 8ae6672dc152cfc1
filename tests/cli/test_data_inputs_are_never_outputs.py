"""``harnessrl data``: no command writes over a file it reads. ``filter in.jsonl out.jsonl --report
in.jsonl`` replaced the records with the report; every output (OUT, ``--train``, ``--test``,
``--report``) naming an input (IN, calibrate's ``--config``), by any spelling or link, is refused
with exit 2 naming the option, before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from harnessrl.cli.main import app


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def refused(result: Result, *named: str) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for name in named:
        assert name in result.output, result.output
    return result.output


@pytest.fixture
def records(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    lines = [
        json.dumps(
            {"instance_id": f"r{i}", "problem_statement": "hi", "repo": f"o/r{i}", "FAIL_TO_PASS": ["t"]}
        )
        for i in range(4)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_no_output_may_be_the_input(records: Path, tmp_path: Path):
    original = records.read_text()
    out = tmp_path / "out.jsonl"
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.jsonl").symlink_to(records)
    (tmp_path / "hard.jsonl").hardlink_to(records)
    spellings = [
        records,
        tmp_path / "sub" / ".." / "in.jsonl",
        tmp_path / "link.jsonl",
        tmp_path / "hard.jsonl",
    ]
    for same in spellings:
        refused(invoke("data", "filter", records, out, "--report", same), "--report", "is IN")
        refused(invoke("data", "filter", records, same), "OUT", "is IN")
        refused(invoke("data", "select", records, same), "OUT", "is IN")
        refused(invoke("data", "select", records, out, "--report", same), "--report", "is IN")
        split = ["data", "split", records, "--test-size", "1"]
        refused(invoke(*split, "--train", same, "--test", out), "--train", "is IN")
        refused(invoke(*split, "--train", out, "--test", same), "--test", "is IN")
        refused(invoke(*split, "--train", out, "--test", tmp_path / "t.jsonl", "--report", same), "--report")
    config = tmp_path / "rollout.toml"
    config.write_text("[engine]\n")
    calibrate = ["data", "calibrate", records, out, "--config", config]
    refused(invoke(*calibrate, "--report", records), "--report", "is IN")
    refused(invoke(*calibrate, "--report", config), "--report", "is --config")
    refused(invoke("data", "calibrate", records, config, "--config", config), "OUT", "is --config")
    assert records.read_text() == original and config.read_text() == "[engine]\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "hard.jsonl",
        "in.jsonl",
        "link.jsonl",
        "rollout.toml",
        "sub",
    ]
    # Control: an output of its own is written.
    assert invoke("data", "filter", records, out, "--report", tmp_path / "report.json").exit_code == 0
    assert out.is_file() and json.loads((tmp_path / "report.json").read_text())["in"] == str(records)
