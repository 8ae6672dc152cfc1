"""A store whose recorded calls cannot all be read back (a damaged row: ``store.codecs`` refuses to
guess): sft reads only each rollout's final attempt, as it trains only on that, and leaves out a
rollout whose final attempt cannot be read, counted; it never stops on a traceback."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.sft.test_cli import runner, write_config

from harnessrl.cli.main import app


def _retried_with_attempt_0_damaged(db: Path, rollout_id: str) -> None:
    """Make ``rollout_id`` a rollout whose final attempt (1) holds a copy of its calls and whose
    earlier attempt 0 holds a row that no longer decodes, as a retried attempt can leave it."""
    with sqlite3.connect(db) as conn:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(calls)")]
        shifted = {
            "call_id": "call_id || '-a1'",
            "seq": "seq + 100",
            "attempt": "1",
            "prompt_base_seq": "prompt_base_seq + 100",
            "request_base_seq": "request_base_seq + 100",
        }
        select = ", ".join(shifted.get(c, c) for c in columns)
        conn.execute(
            f"INSERT INTO calls ({', '.join(columns)}) SELECT {select} FROM calls WHERE rollout_id = ?",
            (rollout_id,),
        )
        conn.execute(
            "UPDATE calls SET response = '{damaged' WHERE rollout_id = ? AND attempt = 0", (rollout_id,)
        )
        conn.execute("UPDATE rollouts SET attempt = 1 WHERE rollout_id = ?", (rollout_id,))


def _damage_final_attempt(db: Path, rollout_id: str) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE calls SET response = '{damaged' WHERE rollout_id = ?", (rollout_id,))


def test_export_reads_the_final_attempt_and_leaves_out_a_rollout_it_cannot_read(record, solving, tmp_path):
    rec = record([solving, solving, solving], [1.0, 1.0, 1.0])
    rec.store.close()
    db = rec.run_dir / "harnessrl.db"
    _retried_with_attempt_0_damaged(db, rec.rollout_ids[0])
    _damage_final_attempt(db, rec.rollout_ids[1])
    out = tmp_path / "out.jsonl"
    result = runner.invoke(app, ["sft", str(write_config(tmp_path, rec.run_dir)), "--export-jsonl", str(out)])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    # rollout 0 from its final attempt (its damaged attempt 0 unread), rollout 2 whole, rollout 1 left out
    assert [line["rollout_id"] for line in lines] == [rec.rollout_ids[0], rec.rollout_ids[2]]
    assert lines[0]["messages"][-1]["content"] == "The answer is 42."
    assert '"calls_unreadable": 1' in result.output, result.output


def test_training_data_is_read_past_a_damaged_earlier_attempt(record, solving, tmp_path):
    from harnessrl.engines.tiny import tiny_model_dir
    from harnessrl.sft.config import SftConfig
    from harnessrl.sft.data import load_data

    rec = record([solving, solving], [1.0, 1.0])
    rec.store.close()
    db = rec.run_dir / "harnessrl.db"
    _retried_with_attempt_0_damaged(db, rec.rollout_ids[0])
    _damage_final_attempt(db, rec.rollout_ids[1])
    config = SftConfig.model_validate(
        {
            "run": {"name": "s", "dir": str(tmp_path / "s")},
            "source": {"run_dir": str(rec.run_dir)},
            "sft": {"model": "tiny"},
        }
    )
    data = load_data(config, tiny_model_dir(weights=False))
    assert data.rollout_ids == [rec.rollout_ids[0]]
    assert data.selected.dropped["calls_unreadable"] == 1
    assert data.report.calls == 2 and data.samples  # attempt 1's two calls, rendered
