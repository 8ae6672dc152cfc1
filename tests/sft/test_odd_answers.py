"""Recorded answers ``harnessrl sft`` stopped on with a traceback, whatever else the store held: a
lone UTF-16 surrogate in the text (a native teacher's answer cut inside an emoji, recorded as the
upstream sent it: the student's tokenizer cannot encode it, a ``TypeError``) and ``tool_calls`` that
is not a list (teacher mode records a chat upstream's message as it came: a ``TypeError`` in the
normalizer). The first now trains with U+FFFD in the surrogate's place (what the gateway records and
answers now); the second is counted and skipped as ``no_answer``. The rollouts are recorded by a real
gateway; the odd answers are written into its store as an older gateway or an odd upstream left them.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.sft.test_cli import runner, write_config

from harnessrl.cli.main import app


def _set_last_answer(db: Path, rollout_id: str, response: str) -> None:
    """Replace the recorded answer of ``rollout_id``'s last call with the JSON text ``response``."""
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE calls SET response = ? WHERE rollout_id = ? AND seq = "
            "(SELECT MAX(seq) FROM calls WHERE rollout_id = ?)",
            (response, rollout_id, rollout_id),
        )


def test_a_lone_surrogate_trains_and_tool_calls_that_are_no_list_are_skipped(record, solving, tmp_path):
    rec = record([solving, solving], [1.0, 1.0])
    rec.store.close()
    db = rec.run_dir / "harnessrl.db"
    # JSON text as the store keeps it (ASCII, the surrogate escaped), as json.dumps writes it
    _set_last_answer(db, rec.rollout_ids[0], json.dumps({"role": "assistant", "content": "It is 42 \ud83d."}))
    _set_last_answer(
        db, rec.rollout_ids[1], json.dumps({"role": "assistant", "content": "", "tool_calls": 5})
    )
    config = str(write_config(tmp_path, rec.run_dir))
    result = runner.invoke(app, ["sft", config, "--set", "sft.epochs=1"])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "runs" / "student" / "sft_data.json").read_text())
    assert data["calls"] == 4 and data["calls_rendered"] == 3, data
    assert data["calls_skipped"] == {"no_answer": 1}, data
    # the surrogate's answer is in the export as U+FFFD (the JSONL is valid UTF-8)
    out = tmp_path / "out.jsonl"
    result = runner.invoke(app, ["sft", config, "--export-jsonl", str(out)])
    assert result.exit_code == 0, result.output
    finals = [json.loads(line)["messages"][-1]["content"] for line in out.read_text("utf-8").splitlines()]
    assert "It is 42 \ufffd." in finals, finals
