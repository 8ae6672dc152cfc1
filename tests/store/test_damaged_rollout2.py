"""A rollout row damaged while it runs can still be ended: ``fail_unreadable_rollout`` ends it
``failed`` (``infra_failure``) by a write that decodes none of its damaged columns (every other end
merges into its JSON or returns the row, and raised, so it stayed ``running`` for ever), and it
touches nothing else: not a row that reads whole, not one that ended, not a later attempt. A call
row that cannot be decoded names the call, its attempt and the column. Every backend (SQLite file
and memory, a real PostgreSQL on loopback); rows damaged with SQL beside an undamaged control row."""

from __future__ import annotations

import pytest

from harnessrl.errors import Conflict, NotFound
from harnessrl.schemas import Call, Outcome, RolloutStatus, ToolRequest
from harnessrl.store import codecs
from harnessrl.store.base import Store
from harnessrl.store.damage import CallsUnreadable, RolloutUnreadable, read_attempt_calls


def sql(store: Store, statement: str, *params: object) -> int:
    statement = statement.replace("?", store.PARAM)  # type: ignore[attr-defined]
    with store._write() as conn:  # type: ignore[attr-defined]
        return conn.execute(statement, params).rowcount


def raw(store: Store, rollout_id: str) -> dict[str, object]:
    p = store.PARAM  # type: ignore[attr-defined]
    with store._read() as conn:  # type: ignore[attr-defined]
        row = conn.execute(
            f"SELECT status, outcome, worker_id, error, finished_at, attempt, task, metadata "
            f"FROM rollouts WHERE rollout_id = {p}",
            (rollout_id,),
        ).fetchone()
    return {key: row[key] for key in row.keys()}  # noqa: SIM118


def running(store: Store, *ids: str) -> None:
    store.create_run("run")
    for rollout_id in ids:
        store.create_rollout(rollout_id=rollout_id, run_id="run", task={"prompt": rollout_id})
    assert len(store.claim_rollouts("w", len(ids), run_id="run")) == len(ids)


@pytest.mark.parametrize("column", ["task", "flags", "metadata"])
def test_a_running_rollout_whose_row_was_damaged_ends_failed(store: Store, column: str) -> None:
    running(store, "good", "bad")
    assert sql(store, f"UPDATE rollouts SET {column} = '{{damaged' WHERE rollout_id = ?", "bad") == 1
    with pytest.raises(RolloutUnreadable):  # the control: no end the store had could be written
        store.finish_rollout("bad", Outcome.INFRA_FAILURE, 0.0, attempt=0)
    assert raw(store, "bad")["status"] == RolloutStatus.RUNNING.value

    ended: list[str] = []
    stop = store.watch_rollout_ends(ended.append)
    try:
        assert store.fail_unreadable_rollout("bad", attempt=0) is True  # type: ignore[attr-defined]
    finally:
        stop()
    row = raw(store, "bad")
    assert row["status"] == RolloutStatus.FAILED.value and row["outcome"] == Outcome.INFRA_FAILURE.value
    assert row["worker_id"] is None and row["finished_at"] is not None
    assert "rollout bad" in str(row["error"]) and column in str(row["error"])
    assert ended == ["bad"]
    p = store.PARAM  # type: ignore[attr-defined]
    with store._read() as conn:  # type: ignore[attr-defined]
        kept = conn.execute(f"SELECT {column} FROM rollouts WHERE rollout_id = {p}", ("bad",)).fetchone()
    assert kept[column] == "{damaged"  # nothing written over the damage
    # it is ended: nothing more to do, and the control row beside it is untouched
    assert store.fail_unreadable_rollout("bad", attempt=0) is False  # type: ignore[attr-defined]
    good = store.get_rollout("good")
    assert good.status is RolloutStatus.RUNNING and good.task == {"prompt": "good"}
    assert store.count_rollouts(run_id="run", status=RolloutStatus.FAILED) == 1


def test_it_never_ends_a_readable_row_another_attempt_or_an_unknown_id(store: Store) -> None:
    running(store, "whole", "moved")
    assert store.fail_unreadable_rollout("whole") is False  # type: ignore[attr-defined]
    assert store.get_rollout("whole").status is RolloutStatus.RUNNING  # the probe would notice an end
    store.requeue_rollout("moved", error="restarted")  # now at attempt 1
    assert sql(store, "UPDATE rollouts SET metadata = '[1,' WHERE rollout_id = ?", "moved") == 1
    assert store.fail_unreadable_rollout("moved", attempt=0) is False  # type: ignore[attr-defined]
    assert raw(store, "moved")["status"] == RolloutStatus.QUEUED.value
    assert store.fail_unreadable_rollout("moved", attempt=1) is True  # type: ignore[attr-defined]
    assert raw(store, "moved")["status"] == RolloutStatus.FAILED.value
    with pytest.raises(NotFound):
        store.fail_unreadable_rollout("missing")  # type: ignore[attr-defined]


def test_damaged_records_are_conflicts_the_gateway_answers_409() -> None:
    assert issubclass(RolloutUnreadable, Conflict) and issubclass(RolloutUnreadable, ValueError)
    assert issubclass(CallsUnreadable, Conflict)


def call(rollout_id: str, attempt: int, text: str) -> Call:
    return Call(
        rollout_id=rollout_id,
        attempt=attempt,
        prompt_token_ids=[1, 2],
        response_token_ids=[3],
        response_logprobs=[-0.5],
        request={"messages": [{"role": "user", "content": text}]},
        response={"content": text},
    )


@pytest.mark.parametrize(
    ("column", "damage", "value"),
    [
        ("response", "response = ?", "{damaged"),
        ("usage", "usage = ?", "[1,"),
        ("response_logprobs", "response_logprobs = ?", b"\x00\x01\x02"),  # not a whole float64
    ],
)
def test_a_damaged_call_row_names_the_call_its_attempt_and_column(
    store: Store, column: str, damage: str, value: object
) -> None:
    running(store, "r", "control")
    store.add_call(call("r", 0, "first"))
    store.requeue_rollout("r", error="retried", attempt=0)
    store.claim_rollouts("w", 1, run_id="run")
    store.add_call(call("r", 1, "second"))
    store.add_call(call("control", 0, "control"))
    assert sql(store, f"UPDATE calls SET {damage} WHERE rollout_id = ? AND attempt = 0", value, "r") == 1

    with pytest.raises(ValueError) as caught:  # as the JSONDecodeError readers caught before
        store.list_calls("r")
    assert isinstance(caught.value, codecs.CallUnreadable)
    assert (caught.value.rollout_id, caught.value.seq, caught.value.attempt) == ("r", 0, 0)
    assert caught.value.column == column
    assert f"call r/0 (attempt 0): its {column} column" in str(caught.value)
    with pytest.raises(CallsUnreadable) as named:
        read_attempt_calls(store, "r", 0)
    assert "rollout r attempt 0" in str(named.value) and column in str(named.value)
    # the readable attempt and the control rollout read as written
    assert [c.response for c in read_attempt_calls(store, "r", 1)] == [{"content": "second"}]
    assert [c.response for c in store.list_calls("control")] == [{"content": "control"}]


def test_a_damaged_tool_request_row_is_a_conflict_naming_it(store: Store) -> None:
    """It raised ``JSONDecodeError`` (the control API's ``/tool_requests`` answered 500)."""
    running(store, "r", "control")
    for rollout_id in ("r", "control"):
        store.add_tool_request(
            ToolRequest(rollout_id=rollout_id, tool="search", request={"q": "x"}, response={"hits": []})
        )
    assert sql(store, "UPDATE tool_requests SET response = '{damaged' WHERE rollout_id = ?", "r") == 1
    with pytest.raises(Conflict) as caught:
        store.list_tool_requests("r")
    assert "rollout r attempt 0" in str(caught.value) and "response column" in str(caught.value)
    [kept] = store.list_tool_requests("control")  # the control reads as written
    assert kept.response == {"hits": []}
