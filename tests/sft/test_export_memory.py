"""``harnessrl sft --export-jsonl`` holds one rollout's conversations at a time, not the store's.

It gathered every line before writing the first: a teacher run's store (thousands of rollouts, each
line an agent's whole history) was in memory at once, as dicts larger than its JSON. Here one
rollout with a long task, recorded by a real gateway, is copied into more (as a long teacher run
leaves them): exporting twelve times as many rollouts must not hold more memory to speak of.
"""

from __future__ import annotations

import json
import sqlite3
import tomllib
import tracemalloc
from pathlib import Path
from typing import Any

from tests.sft.conftest import ADMIN_KEY, agent
from tests.sft.test_cli import write_config

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.schemas import Outcome
from harnessrl.sft.config import SftConfig
from harnessrl.sft.data import export_conversations
from harnessrl.store.sqlite import SQLiteStore

#: About 100 KB of text in few tokens (runs of dashes): the calls' token IDs stay small.
TASK = "Summarize this log:\n" + "\n".join(f"{i:05d} " + "-" * 256 for i in range(400))


def record_one(run_dir: Path, tokenizer: Any, solving: list[dict[str, Any]]) -> str:
    """One rollout of ``TASK``, finished with reward 1; its id."""
    run_dir.mkdir(parents=True)
    store = SQLiteStore(run_dir / "harnessrl.db")
    try:
        engine = ScriptedEngine(solving, tokenizer, context_length=20_000)  # the task is long
        app = create_app(GatewayConfig(admin_key=ADMIN_KEY), store, engine)
        with serve_in_thread(app) as url, GatewayClient(url, ADMIN_KEY) as client:
            created = client.create_rollout({"prompt": "x"}, run_id="teacher", task_id="t")
            agent(created["base_url"], created["api_key"], TASK)
        store.finish_rollout(created["rollout_id"], Outcome.SUCCESS, 1.0)
    finally:
        store.close()
    return str(created["rollout_id"])


def copy_rollout(db: Path, rollout_id: str, names: range) -> None:
    """Copies of ``rollout_id`` and its calls, one per name in ``names``."""
    with sqlite3.connect(db) as conn:
        rollout_cols = [r[1] for r in conn.execute("PRAGMA table_info(rollouts)") if r[1] != "pk"]
        call_cols = [r[1] for r in conn.execute("PRAGMA table_info(calls)")]
        for k in names:
            renamed = {"rollout_id": f"rollout_id || '-{k}'", "api_key": f"api_key || '-{k}'"}
            conn.execute(
                f"INSERT INTO rollouts ({', '.join(rollout_cols)}) SELECT "
                f"{', '.join(renamed.get(c, c) for c in rollout_cols)} FROM rollouts WHERE rollout_id = ?",
                (rollout_id,),
            )
            renamed = {"rollout_id": f"rollout_id || '-{k}'", "call_id": f"call_id || '-{k}'"}
            conn.execute(
                f"INSERT INTO calls ({', '.join(call_cols)}) SELECT "
                f"{', '.join(renamed.get(c, c) for c in call_cols)} FROM calls WHERE rollout_id = ?",
                (rollout_id,),
            )


def peak_of_export(config: SftConfig, out: Path) -> tuple[int, dict[str, Any]]:
    """The peak of Python allocations while ``config``'s selection is exported to ``out``."""
    tracemalloc.start()
    try:
        summary = export_conversations(config, out)
        return tracemalloc.get_traced_memory()[1], summary
    finally:
        tracemalloc.stop()


def test_the_export_holds_one_rollout_at_a_time(tmp_path, tokenizer, solving):
    teacher = tmp_path / "teacher"
    rollout_id = record_one(teacher, tokenizer, solving)
    raw = tomllib.loads(write_config(tmp_path, teacher).read_text())
    config = SftConfig.model_validate({**raw, "source": {"run_dir": str(teacher)}})
    copy_rollout(teacher / "harnessrl.db", rollout_id, range(4))
    small, _ = peak_of_export(config, tmp_path / "small.jsonl")  # 5 rollouts (and one-time costs)
    copy_rollout(teacher / "harnessrl.db", rollout_id, range(4, 59))
    out = tmp_path / "large.jsonl"
    large, summary = peak_of_export(config, out)  # 60 rollouts
    lines = out.read_text().splitlines()
    assert summary["conversations"] == len(lines) == summary["rollouts"] == 60
    assert TASK in json.loads(lines[-1])["messages"][1]["content"]
    written = out.stat().st_size
    assert written > 60 * len(TASK)
    # Holding every line, the peak grew by more than what was written (~6 MB); one at a time, by little.
    assert large - small < written / 4, (small, large, written)
