"""The dashboard shows the calls that never became training data (issue 36): a rollout's trace names
the calls its gateway dropped and the calls recorded after its evaluator read them; the runs page
charts the trainer's per-step counts."""

from __future__ import annotations

import json
from pathlib import Path

from starlette.testclient import TestClient
from tests.dashboard.conftest import ADMIN_KEY, _call

from harnessrl.dashboard import create_dashboard_app
from harnessrl.schemas import Outcome
from harnessrl.store.sqlite import SQLiteStore


def run_folder(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    store = SQLiteStore(run_dir / "harnessrl.db")
    store.create_run("run", {"run": {"name": "run"}})
    for rid in ("r-dropped", "r-clean"):
        store.create_rollout(rollout_id=rid, run_id="run", metadata={"kind": "train"})
        store.start_rollout(rid)
        for n in range(3):
            store.add_call(_call(rid, [1, 2, 3 + n], [7], 0))
    store.count_dropped_call("r-dropped", "client_gone")
    store.count_dropped_call("r-dropped", "client_gone")
    store.count_dropped_call("r-dropped", "slow_reader")
    store.finish_rollout("r-dropped", Outcome.SUCCESS, 1.0, metadata={"calls_seen": 2})
    store.finish_rollout("r-clean", Outcome.SUCCESS, 1.0)
    store.close()
    rows = [
        {"step": s, "time": 1000.0 + s, "reward/mean": 0.5, "trajectory/calls_dropped/client_gone": float(s)}
        for s in (1, 2)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def test_dropped_and_unseen_calls_are_shown(tmp_path: Path) -> None:
    with TestClient(create_dashboard_app(run_folder(tmp_path), ADMIN_KEY)) as client:
        client.get(f"/ui/?key={ADMIN_KEY}")
        trace = client.get("/ui/rollouts/r-dropped").text
        assert "calls recorded after the evaluator read them, left out: 1" in trace
        assert (
            "calls dropped by the gateway (never recorded): {&#x27;client_gone&#x27;: 2, &#x27;slow_reader&#x27;: 1}"
            in trace
        )
        clean = client.get("/ui/rollouts/r-clean").text  # control: nothing to say, nothing said
        assert "left out" not in clean and "dropped by the gateway" not in clean
        assert 'aria-label="Calls dropped, not trained on' in client.get("/ui/").text
