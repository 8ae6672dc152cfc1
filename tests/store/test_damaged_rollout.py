"""A rollout row whose JSON columns no longer decode (a disk or a bad writer damaged it) is never
guessed at: reading it raises ``RolloutUnreadable`` naming the rollout and the column, a listing
leaves it out (the other rows are still listed), and a claim ends it as an infrastructure failure
instead of handing it out or losing the rest of the claim. Every backend (SQLite file and memory,
a real PostgreSQL on loopback); the rows are damaged with SQL, beside an undamaged control row."""

from __future__ import annotations

import pytest

from harnessrl.schemas import Outcome, RolloutStatus
from harnessrl.store.base import Store
from harnessrl.store.damage import RolloutUnreadable


def damage(store: Store, rollout_id: str, column: str, text: str = "{damaged") -> None:
    assert column in ("task", "flags", "metadata")
    p = store.PARAM  # type: ignore[attr-defined]
    with store._write() as conn:  # type: ignore[attr-defined]
        changed = conn.execute(
            f"UPDATE rollouts SET {column} = {p} WHERE rollout_id = {p}", (text, rollout_id)
        ).rowcount
    assert changed == 1


def make(store: Store, *ids: str) -> None:
    store.create_run("run")
    for rollout_id in ids:
        store.create_rollout(
            rollout_id=rollout_id, run_id="run", task={"prompt": rollout_id}, metadata={"k": 1}
        )


@pytest.mark.parametrize(
    ("column", "text", "named"),
    [
        ("task", "{damaged", "task"),
        ("flags", "[1,", "flags"),
        ("metadata", "\x01not json", "metadata"),
        ("metadata", "[]", "row"),  # decodes, but not what a rollout's metadata is
    ],
)
def test_get_rollout_names_the_damaged_row(store: Store, column: str, text: str, named: str) -> None:
    make(store, "good", "bad")
    damage(store, "bad", column, text)
    with pytest.raises(RolloutUnreadable) as caught:
        store.get_rollout("bad")
    assert caught.value.rollout_id == "bad"
    assert caught.value.column == named
    assert "rollout bad" in str(caught.value) and named in str(caught.value)
    # the row beside it reads as written (the probe would notice a store that failed every read)
    good = store.get_rollout("good")
    assert good.task == {"prompt": "good"} and good.metadata == {"k": 1}
    # a write that returns the row names it too, and an idempotent create of its id
    with pytest.raises(RolloutUnreadable):
        store.create_rollout(rollout_id="bad", run_id="run")
    with pytest.raises(RolloutUnreadable):
        store.update_rollout_metadata("bad", {"x": 1})
    with pytest.raises(RolloutUnreadable):
        store.count_dropped_call("bad", "too_long")
    p = store.PARAM  # type: ignore[attr-defined]
    with store._read() as conn:  # type: ignore[attr-defined]
        row = conn.execute(f"SELECT {column} FROM rollouts WHERE rollout_id = {p}", ("bad",)).fetchone()
    assert row[column] == text  # nothing was written over the damage


def test_list_rollouts_leaves_out_only_the_damaged_row(store: Store) -> None:
    make(store, "r0", "r1", "r2")
    damage(store, "r1", "metadata")
    assert [r.rollout_id for r in store.list_rollouts(run_id="run")] == ["r0", "r2"]
    assert [r.rollout_id for r in store.list_rollouts(run_id="run", status=RolloutStatus.QUEUED)] == [
        "r0",
        "r2",
    ]
    assert store.count_rollouts(run_id="run") == 3  # the row is still there, only unreadable


def test_claim_ends_the_damaged_row_and_hands_out_the_rest(store: Store) -> None:
    make(store, "r0", "r1", "r2")
    damage(store, "r1", "task")
    ended: list[str] = []
    stop = store.watch_rollout_ends(ended.append)
    try:
        claimed = store.claim_rollouts("w", 3, run_id="run")
    finally:
        stop()
    assert [r.rollout_id for r in claimed] == ["r0", "r2"]
    assert all(r.status is RolloutStatus.RUNNING and r.worker_id == "w" for r in claimed)
    assert ended == ["r1"]
    # r1 ended as an infrastructure failure naming the damage: not queued (a claim would take it
    # again, for ever), not running with no worker to run it
    assert store.count_rollouts(run_id="run", status=RolloutStatus.FAILED) == 1
    p = store.PARAM  # type: ignore[attr-defined]
    with store._read() as conn:  # type: ignore[attr-defined]
        row = conn.execute(
            f"SELECT status, outcome, worker_id, error, finished_at FROM rollouts WHERE rollout_id = {p}",
            ("r1",),
        ).fetchone()
    assert row["status"] == RolloutStatus.FAILED.value and row["outcome"] == Outcome.INFRA_FAILURE.value
    assert row["worker_id"] is None and row["finished_at"] is not None
    assert "rollout r1" in row["error"] and "task" in row["error"]
    assert store.claim_rollouts("w", 3, run_id="run") == []  # nothing queued is left: no spin
