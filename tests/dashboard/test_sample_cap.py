"""The dashboard shows the samples the trainer trains on: with the run's ``trainer.max_sample_tokens``
a call longer than it is dropped (docs/trajectories.md "Length limit"), so the trace, the compare
page and the table's sample count leave it out too; and calls the trainer refuses (``InvalidBatch``)
are a trace without samples, not a failed page."""

from __future__ import annotations

import re
from pathlib import Path

from starlette.testclient import TestClient
from tests.dashboard.conftest import ADMIN_KEY, _call

from harnessrl.dashboard import create_dashboard_app
from harnessrl.schemas import Call, Outcome
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.trajectory import build_rollout_samples

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
CAP = 16


def _store(tmp_path: Path) -> Path:
    """Run ``capped`` (``trainer.max_sample_tokens`` 16) and run ``open`` (no cap), each with rollout
    ``RUN-r``: a 5-token call, then a 19-token call extending it, then a 3-token new context; and
    ``RUN-solo``: one 19-token call."""
    store = SQLiteStore(tmp_path / "harnessrl.db")
    for run, trainer in (("capped", {"max_sample_tokens": CAP}), ("open", {"max_sample_tokens": None})):
        store.create_run(run, {"run": {"name": run}, "trainer": trainer})
        calls = {
            f"{run}-r": [([1, 2, 3], [4, 5]), ([1, 2, 3, 4, 5] + [6] * 12, [7, 7]), ([9, 9], [8])],
            f"{run}-solo": [([1, 2, 3] + [6] * 14, [7, 7])],
        }
        for rollout_id, made in calls.items():
            store.create_rollout(rollout_id=rollout_id, run_id=run, metadata={"kind": "train"})
            store.start_rollout(rollout_id)
            for prompt, sampled in made:
                store.add_call(_call(rollout_id, prompt, sampled, 0))
            store.finish_rollout(rollout_id, Outcome.SUCCESS, 1.0)
    store.close()
    return tmp_path


def _sample_sizes(page: str) -> list[int]:
    return [int(n) for n in re.findall(r'<h3 id="sample-\d+">sample \d+: (\d+) tokens', page)]


def _table_samples(page: str) -> dict[str, int]:
    """rollout id -> its samples cell in the rollouts table."""
    rows = re.findall(r'class="trace-link" href="[^"]+">([^<]+)</a>.*?</tr>', page, flags=re.S)
    cells = re.findall(r"<td class=num>(\d+)</td><td>[^<]*</td><td>[^<]*</td></tr>", page)
    return {rollout_id: int(n) for rollout_id, n in zip(rows, cells, strict=True)}


def test_trace_compare_and_table_drop_calls_over_the_runs_max_sample_tokens(tmp_path: Path) -> None:
    with TestClient(create_dashboard_app(_store(tmp_path), ADMIN_KEY)) as client:
        capped = client.get("/ui/rollouts/capped-r", headers=ADMIN).text
        # As the trainer: sample 0 ends at the 5-token call (the 19-token one is dropped, a "length" break).
        assert _sample_sizes(capped) == [5, 3]
        assert "length" in capped and "calls longer than trainer.max_sample_tokens (16), dropped: 1" in capped
        assert "dropped: 19 tokens, over trainer.max_sample_tokens (16)" in capped  # the calls table
        # Control: a run without the cap trains the 19-token call, and the page shows it.
        uncapped = client.get("/ui/rollouts/open-r", headers=ADMIN).text
        assert _sample_sizes(uncapped) == [19, 3] and "over trainer.max_sample_tokens" not in uncapped
        compare = client.get("/ui/compare", params={"a": "capped-r", "b": "open-r"}, headers=ADMIN).text
        assert _sample_sizes(compare) == [5, 3, 19, 3]
        # The table: a rollout whose only call is over the cap makes no sample.
        table = _table_samples(client.get("/ui/rollouts", headers=ADMIN).text)
        assert table == {"capped-r": 2, "capped-solo": 0, "open-r": 2, "open-solo": 1}


def test_the_counts_match_the_trainers_samples(tmp_path: Path) -> None:
    """The table's counts are those ``build_rollout_samples`` makes with each run's cap."""
    store = SQLiteStore(_store(tmp_path) / "harnessrl.db")
    built = {
        rollout_id: len(
            build_rollout_samples(
                store.get_rollout(rollout_id),
                store.list_calls(rollout_id),
                max_sample_tokens=CAP if rollout_id.startswith("capped") else None,
            ).samples
        )
        for rollout_id in ("capped-r", "capped-solo", "open-r", "open-solo")
    }
    store.close()
    with TestClient(create_dashboard_app(tmp_path, ADMIN_KEY)) as client:
        assert _table_samples(client.get("/ui/rollouts", headers=ADMIN).text) == built


def test_calls_the_trainer_refuses_show_a_trace_without_samples(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "harnessrl.db")
    store.create_run("run", {})
    store.create_rollout(rollout_id="bad", run_id="run")
    store.start_rollout("bad")
    # Two sampled tokens but one logprob: build_rollout_samples raises InvalidBatch for this call.
    store.add_call(
        Call(rollout_id="bad", prompt_token_ids=[1], response_token_ids=[4, 5], response_logprobs=[-0.1])
    )
    store.finish_rollout("bad", Outcome.SUCCESS, 1.0)
    store.close()
    with TestClient(create_dashboard_app(tmp_path, ADMIN_KEY)) as client:
        trace = client.get("/ui/rollouts/bad", headers=ADMIN)
        assert trace.status_code == 200 and "the trainer refuses these calls" in trace.text
        assert "2 response tokens but 1 logprobs" in trace.text and "<table class=calls>" in trace.text
        compare = client.get("/ui/compare", params={"a": "bad", "b": "bad"}, headers=ADMIN)
        assert compare.status_code == 200 and compare.text.count("the trainer refuses these calls") == 2
