"""The rollouts table's sample counts come from the store's chain bases, never from decoding calls:
each count equals what ``build_rollout_samples`` makes of the decoded calls, on the call shapes
agents produce, and the table still renders when every call's tokens and request are unreadable
(regression: the table decoded every call of its 50 rollouts in full and built their samples, ~4 s
for rollouts of 100 calls growing to ~32k tokens, to show one number per row)."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from tests.dashboard.conftest import ADMIN_KEY

from harnessrl.dashboard import create_dashboard_app
from harnessrl.dashboard.data import DashboardData, RolloutFilter
from harnessrl.schemas import Call, Outcome
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.trajectory import build_rollout_samples

SYSTEM = [1, 2, 3]


def _call(rollout_id: str, prompt: list[int], response: list[int], attempt: int = 0) -> Call:
    return Call(
        rollout_id=rollout_id,
        attempt=attempt,
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_logprobs=[-0.5] * len(response),
        request={"messages": [{"role": "user", "content": f"{len(prompt)} tokens"}]},
    )


# Each shape: (its name, its calls of attempt 0 as (prompt, response), the samples it makes).
def _linear() -> list[tuple[list[int], list[int]]]:
    """An agent's turns, each prompt the whole conversation so far plus a tool result."""
    calls, context = [], list(SYSTEM)
    for turn in range(6):
        response = [100 + turn, 101 + turn]
        calls.append((list(context), response))
        context += response + [50 + turn]
    return calls


SHAPES: dict[str, list[tuple[list[int], list[int]]]] = {
    "linear": _linear(),
    "subagent interleaved": [
        (SYSTEM, [10, 11]),
        ([7, 8], [20]),  # a subagent: its own context
        (SYSTEM + [10, 11, 60], [12]),  # the main agent goes on
        ([7, 8, 20, 61], [21]),  # and so does the subagent
        (SYSTEM + [10, 11, 60, 12, 62], [13]),
    ],
    "retried request": [
        (SYSTEM, [10, 11]),
        (SYSTEM + [10, 11, 60], [12]),
        (SYSTEM + [10, 11, 60], [14]),  # the same request again: a new sample
        (SYSTEM + [10, 11, 60, 14, 61], [15]),  # extends the retry's chain
    ],
    "history edited": [
        (SYSTEM, [10, 11]),
        (SYSTEM + [10, 11, 60], [12]),
        (SYSTEM + [10, 11, 99], [13]),  # the tool output rewritten: a new sample
        (SYSTEM + [10, 11, 60, 12, 61], [16]),  # the first chain again
    ],
    "compacted": [(SYSTEM, [10, 11]), ([1, 2, 40], [12]), ([1, 2, 40, 12, 63], [13])],
    "empty answers": [(SYSTEM, []), ([5, 6], [30]), ([5, 6, 30, 7], [])],
    "one call": [(SYSTEM, [10])],
}


def _build(tmp_path: Path) -> Path:
    store = SQLiteStore(tmp_path / "harnessrl.db")
    store.create_run("run", {})
    for name, calls in SHAPES.items():
        store.create_rollout(rollout_id=name, run_id="run")
        store.start_rollout(name)
        for prompt, response in calls:
            store.add_call(_call(name, prompt, response))
        store.finish_rollout(name, Outcome.SUCCESS, 1.0)
    # Retried after an infrastructure failure: attempt 0's calls are not the samples'.
    store.create_rollout(rollout_id="retried attempt", run_id="run")
    store.start_rollout("retried attempt")
    for prompt, response in SHAPES["subagent interleaved"]:
        store.add_call(_call("retried attempt", prompt, response))
    store.requeue_rollout("retried attempt", error="runner lost")
    store.start_rollout("retried attempt")
    for prompt, response in SHAPES["linear"]:
        store.add_call(_call("retried attempt", prompt, response, attempt=1))
    store.finish_rollout("retried attempt", Outcome.SUCCESS, 1.0)
    # The evaluator read 2 calls: the subagent's later calls are in no sample.
    store.create_rollout(rollout_id="calls unseen", run_id="run")
    store.start_rollout("calls unseen")
    for prompt, response in [(SYSTEM, [10]), (SYSTEM + [10, 60], [11]), ([7], [20]), ([8], [21])]:
        store.add_call(_call("calls unseen", prompt, response))
    store.finish_rollout("calls unseen", Outcome.SUCCESS, 1.0, metadata={"calls_seen": 2})
    store.close()
    return tmp_path


def _table_samples(html: str) -> dict[str, str]:
    """The table's samples column by rollout id."""
    head = re.search(r"<table id=rollouts><tr>(.*?)</tr>", html).group(1)  # type: ignore[union-attr]
    names = [re.sub(r"<[^>]+>|[ ↑↓]+$", "", th) for th in re.findall(r"<th[^>]*>(.*?)</th>", head)]
    rows = [
        dict(zip(names, re.findall(r"<td[^>]*>(.*?)</td>", row), strict=True))
        for row in re.findall(r'<tr class="rollout-row">(.*?)</tr>', html)
    ]
    return {re.sub(r"<[^>]+>", "", row["rollout"]): row["samples"] for row in rows}


def test_counts_equal_the_samples_built_from_the_decoded_calls(tmp_path: Path) -> None:
    data = DashboardData(_build(tmp_path) / "harnessrl.db")
    rows = data.page_rollouts(RolloutFilter(), limit=50, offset=0)
    assert len(rows) == len(SHAPES) + 2
    built = {
        row.rollout.rollout_id: len(
            build_rollout_samples(row.rollout, data.list_calls(row.rollout.rollout_id)).samples
        )
        for row in rows
    }
    assert {row.rollout.rollout_id: row.samples for row in rows} == built
    # What each shape makes, so a count and a build that were both wrong would still be caught.
    assert built == {
        "linear": 1,
        "subagent interleaved": 2,
        "retried request": 2,
        "history edited": 2,
        "compacted": 2,
        "empty answers": 1,  # the first chain sampled nothing
        "one call": 1,
        "retried attempt": 1,  # attempt 1's linear calls only
        "calls unseen": 1,
    }


def _break(sql: str) -> Callable[[Path], None]:
    def apply(db: Path) -> None:
        with sqlite3.connect(db) as conn:
            conn.execute(sql)

    return apply


@pytest.mark.parametrize(
    "corrupt",
    [
        _break("UPDATE calls SET prompt_token_ids = x'01', prompt_len = prompt_len + 1"),
        _break("UPDATE calls SET request_items = 'not json', request = '{'"),
        _break("UPDATE calls SET response_logprobs = x'00'"),
    ],
    ids=["prompts", "requests", "logprobs"],
)
def test_the_table_reads_no_call_tokens_or_requests(tmp_path: Path, corrupt: Callable[[Path], None]) -> None:
    folder = _build(tmp_path)
    corrupt(folder / "harnessrl.db")
    client = TestClient(create_dashboard_app(folder, ADMIN_KEY))
    client.get(f"/ui/?key={ADMIN_KEY}")
    response = client.get("/ui/rollouts")
    assert response.status_code == 200
    samples = _table_samples(response.text)
    assert samples["linear"] == "1" and samples["subagent interleaved"] == "2"
    assert samples["retried attempt"] == "1" and samples["calls unseen"] == "1"
