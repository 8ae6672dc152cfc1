"""The ``Store`` contract, run against every backend in ``conftest.BACKENDS``.

Only the protocol's public methods are used, so a new backend passes or fails these unchanged.
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.store.calls import make_call

from harnessrl.errors import BadRequest, Conflict, InvalidTransition, NotFound
from harnessrl.schemas import (
    ROLLOUT_TRANSITIONS,
    Call,
    Outcome,
    PolicyVersion,
    Rollout,
    RolloutStatus,
    Task,
    ToolRequest,
    Usage,
    status_for_outcome,
)
from harnessrl.store import Store
from harnessrl.store.base import DROPPED_CALLS_KEY, RolloutEnded

S = RolloutStatus


def test_implements_the_protocol(store: Store) -> None:
    assert isinstance(store, Store)


# -- runs and tasks -------------------------------------------------------------------------------


def test_runs(store: Store) -> None:
    run = store.create_run("r1", {"lr": 1e-6})
    assert (run.run_id, run.config, run.status) == ("r1", {"lr": 1e-6}, "created")
    assert store.create_run("r1", {"lr": 5.0}) == run  # idempotent: the stored run wins
    store.create_run("r0")
    assert [r.run_id for r in store.list_runs()] == ["r1", "r0"]
    store.set_run_status("r1", "running")
    assert store.get_run("r1").status == "running"
    with pytest.raises(NotFound, match="nope"):
        store.get_run("nope")
    with pytest.raises(NotFound):
        store.set_run_status("nope", "running")


def test_tasks(store: Store) -> None:
    store.add_tasks(
        [
            Task(task_id="t1", run_id="r", data={"prompt": "2+2", "hidden": {"answer": 4}}),
            Task(task_id="t2", run_id="r", split="test"),
            Task(task_id="t3"),
        ]
    )
    store.add_tasks([Task(task_id="t1", data={"changed": True}), Task(task_id="t4", run_id="r")])
    assert store.get_task("t1").data == {"prompt": "2+2", "hidden": {"answer": 4}}  # existing task left alone
    assert [t.task_id for t in store.list_tasks()] == ["t1", "t2", "t3", "t4"]
    assert [t.task_id for t in store.list_tasks(run_id="r")] == ["t1", "t2", "t4"]
    assert [t.task_id for t in store.list_tasks(run_id="r", split="test")] == ["t2"]
    assert [t.task_id for t in store.list_tasks(split="train")] == ["t1", "t3", "t4"]
    store.add_tasks([])
    with pytest.raises(NotFound):
        store.get_task("nope")


# -- creating and finding rollouts ----------------------------------------------------------------


def test_create_rollout_defaults(store: Store) -> None:
    rollout = store.create_rollout(task={"prompt": "hi"}, run_id="r", task_id="t", group_id="g", step=3)
    assert rollout.status is S.QUEUED and rollout.attempt == 0
    assert rollout.api_key.startswith("hrl-") and len(rollout.api_key) >= 30
    assert (rollout.task, rollout.run_id, rollout.task_id, rollout.group_id, rollout.step) == (
        {"prompt": "hi"},
        "r",
        "t",
        "g",
        3,
    )
    assert rollout.outcome is None and rollout.reward is None and rollout.started_at is None
    assert store.get_rollout(rollout.rollout_id) == rollout
    other = store.create_rollout()
    assert other.rollout_id != rollout.rollout_id and other.api_key != rollout.api_key
    assert other.task == {} and other.metadata == {} and other.flags == []


def test_create_rollout_is_idempotent(store: Store) -> None:
    first = store.create_rollout(rollout_id="ro-1", task={"a": 1}, metadata={"m": 1})
    again = store.create_rollout(rollout_id="ro-1", task={"a": 2}, step=9)
    assert again == first  # same key, nothing overwritten
    assert store.count_rollouts() == 1


def test_get_rollout_by_key(store: Store) -> None:
    a, b = store.create_rollout(), store.create_rollout()
    assert store.get_rollout_by_key(a.api_key) == a
    assert store.get_rollout_by_key(b.api_key) == b
    with pytest.raises(NotFound):
        store.get_rollout_by_key("hrl-not-a-key")


UNKNOWN_ID_CALLS: dict[str, Callable[[Store], object]] = {
    "get_rollout": lambda s: s.get_rollout("nope"),
    "start_rollout": lambda s: s.start_rollout("nope"),
    "finish_rollout": lambda s: s.finish_rollout("nope", Outcome.SUCCESS, 1.0),
    "requeue_rollout": lambda s: s.requeue_rollout("nope"),
    "count_dropped_call": lambda s: s.count_dropped_call("nope", "client_gone"),
    "cancel_rollout": lambda s: s.cancel_rollout("nope"),
    "set_rollout_flags": lambda s: s.set_rollout_flags("nope", ["x"]),
    "update_rollout_metadata": lambda s: s.update_rollout_metadata("nope", {"x": 1}),
    "add_call": lambda s: s.add_call(make_call("nope")),
}


@pytest.mark.parametrize("method", list(UNKNOWN_ID_CALLS))
def test_unknown_rollout_raises_not_found(store: Store, method: str) -> None:
    with pytest.raises(NotFound, match="nope"):
        UNKNOWN_ID_CALLS[method](store)
    assert store.list_calls("nope") == [] and store.count_calls("nope") == 0


# -- lifecycle ------------------------------------------------------------------------------------

# How to reach each status through the protocol (every status is reachable in one step from
# queued or running), and how to ask for a move to each status.
MOVE_TO: dict[RolloutStatus, Callable[[Store, str], Rollout]] = {
    S.QUEUED: lambda s, rid: s.requeue_rollout(rid),
    S.RUNNING: lambda s, rid: s.start_rollout(rid),
    S.FINISHED: lambda s, rid: s.finish_rollout(rid, Outcome.SUCCESS, 1.0),
    S.FAILED: lambda s, rid: s.finish_rollout(rid, Outcome.INFRA_FAILURE, 0.0),
    S.CANCELLED: lambda s, rid: s.cancel_rollout(rid),
}
PATH_TO: dict[RolloutStatus, list[RolloutStatus]] = {
    S.QUEUED: [],
    S.RUNNING: [S.RUNNING],
    S.FINISHED: [S.FINISHED],
    S.FAILED: [S.FAILED],
    S.CANCELLED: [S.CANCELLED],
}
ALL_PAIRS = list(itertools.product(S, S))
# start_rollout on a running rollout is documented as a no-op (a rollout's later model calls
# "start" it again), so running -> running is neither a transition nor an error.
IDEMPOTENT = {(S.RUNNING, S.RUNNING)}
ALLOWED = [(a, b) for a, b in ALL_PAIRS if b in ROLLOUT_TRANSITIONS[a]]
FORBIDDEN = [(a, b) for a, b in ALL_PAIRS if b not in ROLLOUT_TRANSITIONS[a] and (a, b) not in IDEMPOTENT]


def rollout_in(store: Store, status: RolloutStatus) -> Rollout:
    rollout = store.create_rollout()
    for step in PATH_TO[status]:
        rollout = MOVE_TO[step](store, rollout.rollout_id)
    assert rollout.status is status
    return rollout


def test_transition_table_is_covered() -> None:
    assert len(ALLOWED) + len(FORBIDDEN) + len(IDEMPOTENT) == len(S) ** 2
    assert ALLOWED and FORBIDDEN


@pytest.mark.parametrize(("before", "after"), ALLOWED, ids=[f"{a}->{b}" for a, b in ALLOWED])
def test_allowed_transition(store: Store, before: RolloutStatus, after: RolloutStatus) -> None:
    rollout = rollout_in(store, before)
    moved = MOVE_TO[after](store, rollout.rollout_id)
    assert moved.status is after
    assert store.get_rollout(rollout.rollout_id) == moved


@pytest.mark.parametrize(("before", "after"), FORBIDDEN, ids=[f"{a}->{b}" for a, b in FORBIDDEN])
def test_forbidden_transition(store: Store, before: RolloutStatus, after: RolloutStatus) -> None:
    rollout = rollout_in(store, before)
    with pytest.raises(InvalidTransition) as excinfo:
        MOVE_TO[after](store, rollout.rollout_id)
    message = str(excinfo.value)
    assert rollout.rollout_id in message and before.value in message and after.value in message
    assert store.get_rollout(rollout.rollout_id) == rollout  # nothing changed


def test_start_is_idempotent_on_running(store: Store) -> None:
    started = store.start_rollout(store.create_rollout().rollout_id)
    assert started.started_at is not None
    assert store.start_rollout(started.rollout_id) == started


@pytest.mark.parametrize("outcome", list(Outcome))
def test_finish_rollout(store: Store, outcome: Outcome) -> None:
    rollout = store.create_rollout(metadata={"keep": 1, "over": 1})
    store.start_rollout(rollout.rollout_id)
    done = store.finish_rollout(
        rollout.rollout_id, outcome, 0.5, error="boom", metadata={"over": 2, "tests": [1, 0]}
    )
    assert done.status is status_for_outcome(outcome) and done.outcome is outcome
    assert done.reward == 0.5 and done.error == "boom" and done.finished_at is not None
    assert done.metadata == {"keep": 1, "over": 2, "tests": [1, 0]}
    assert store.get_rollout(rollout.rollout_id) == done


@pytest.mark.parametrize("reward", [math.nan, math.inf, -math.inf])
def test_finish_refuses_a_reward_that_is_not_finite(store: Store, reward: float) -> None:
    """Refused alike by every backend (SQLite stored NaN as NULL, PostgreSQL as NaN: a trainer read
    "no reward" from one and NaN advantages from the other); the rollout is left as it was."""
    rollout = store.start_rollout(store.create_rollout().rollout_id)
    with pytest.raises(BadRequest, match="finite"):
        store.finish_rollout(rollout.rollout_id, Outcome.SUCCESS, reward)
    assert store.get_rollout(rollout.rollout_id) == rollout
    assert store.finish_rollout(rollout.rollout_id, Outcome.SUCCESS, -1e308).reward == -1e308


def test_void_rollout_zeroes_and_flags_a_tampered_rollout(store: Store) -> None:
    rollout = store.create_rollout()
    store.start_rollout(rollout.rollout_id)
    store.finish_rollout(rollout.rollout_id, Outcome.SUCCESS, 1.0)  # by someone else, say
    store.set_rollout_flags(rollout.rollout_id, ["network_fetch"])
    voided = store.void_rollout(rollout.rollout_id, flag="tamper_finished", error="finished elsewhere")
    assert voided.status is S.FINISHED and voided.outcome is Outcome.POLICY_FAILURE
    assert voided.reward == 0.0 and voided.error == "finished elsewhere"
    assert voided.flags == ["network_fetch", "tamper_finished"]
    again = store.void_rollout(rollout.rollout_id, flag="tamper_finished", error="finished elsewhere")
    assert again.flags == ["network_fetch", "tamper_finished"]  # a flag is recorded once
    assert store.get_rollout(rollout.rollout_id) == again


def test_void_rollout_replaces_the_metadata_the_untrusted_finish_merged_in(store: Store) -> None:
    rollout = store.create_rollout(metadata={"infra_failures": 1})
    store.start_rollout(rollout.rollout_id)
    store.finish_rollout(rollout.rollout_id, Outcome.SUCCESS, 1.0, metadata={"calls_seen": 0})
    kept = store.void_rollout(rollout.rollout_id, flag="t", error="e")  # no metadata: left as it is
    assert kept.metadata == {"infra_failures": 1, "calls_seen": 0}
    voided = store.void_rollout(rollout.rollout_id, flag="t", error="e", metadata={"infra_failures": 1})
    assert voided.metadata == {"infra_failures": 1}
    assert store.get_rollout(rollout.rollout_id) == voided


def test_requeue_bumps_attempt_and_keeps_error(store: Store) -> None:
    rollout = store.create_rollout()
    [claimed] = store.claim_rollouts("w1", 1)
    assert claimed.worker_id == "w1"
    requeued = store.requeue_rollout(rollout.rollout_id, error="sandbox died")
    assert requeued.status is S.QUEUED and requeued.attempt == 1 and requeued.worker_id is None
    assert requeued.error == "sandbox died"
    store.start_rollout(rollout.rollout_id)
    again = store.requeue_rollout(rollout.rollout_id)
    assert again.attempt == 2 and again.error == "sandbox died"  # no new error: the old text stays


def test_a_superseded_attempt_neither_finishes_nor_requeues_the_rollout(store: Store) -> None:
    """``attempt``: a controller's result is its attempt's. After a requeue the old attempt's finish or
    requeue is refused (``RolloutEnded``) and changes nothing; the current attempt's goes through."""
    rollout = store.create_rollout()
    store.claim_rollouts("w1", 1)
    store.requeue_rollout(rollout.rollout_id, attempt=0)
    [current] = store.claim_rollouts("w2", 1)
    assert current.attempt == 1
    with pytest.raises(RolloutEnded, match="attempt 0 was superseded"):
        store.finish_rollout(rollout.rollout_id, Outcome.SUCCESS, 1.0, attempt=0)
    with pytest.raises(RolloutEnded):
        store.requeue_rollout(rollout.rollout_id, error="late", attempt=0)
    assert store.get_rollout(rollout.rollout_id) == current
    done = store.finish_rollout(rollout.rollout_id, Outcome.SUCCESS, 0.5, attempt=1)
    assert done.status is S.FINISHED and done.reward == 0.5


def test_a_superseded_attempt_neither_starts_nor_cancels_the_rollout(store: Store) -> None:
    """``attempt`` on ``start_rollout`` and ``cancel_rollout``: a caller that read attempt 0 (a stale
    key, a deadline check) neither starts nor cancels attempt 1; the current attempt's goes through."""
    rollout = store.create_rollout()
    store.claim_rollouts("w1", 1)
    requeued = store.requeue_rollout(rollout.rollout_id, attempt=0)
    with pytest.raises(RolloutEnded, match="attempt 0 was superseded"):
        store.start_rollout(rollout.rollout_id, attempt=0)
    assert store.get_rollout(rollout.rollout_id) == requeued  # still queued, for a worker to claim
    [current] = store.claim_rollouts("w2", 1)
    with pytest.raises(RolloutEnded):
        store.cancel_rollout(rollout.rollout_id, attempt=0)
    assert store.get_rollout(rollout.rollout_id) == current
    assert store.start_rollout(rollout.rollout_id, attempt=1) == current
    assert store.cancel_rollout(rollout.rollout_id, attempt=1).status is S.CANCELLED


def test_requeue_issues_a_new_key(store: Store) -> None:
    """Each attempt has its own key: after a requeue the ended attempt's key finds nothing."""
    rollout = store.create_rollout()
    assert store.get_rollout_by_key(rollout.api_key) == rollout
    store.claim_rollouts("w1", 1)
    requeued = store.requeue_rollout(rollout.rollout_id)
    assert requeued.api_key != rollout.api_key and requeued.api_key.startswith("hrl-")
    with pytest.raises(NotFound):
        store.get_rollout_by_key(rollout.api_key)
    assert store.get_rollout_by_key(requeued.api_key) == requeued
    assert store.get_rollout(rollout.rollout_id).api_key == requeued.api_key


# A controller's error text quotes what failed: a user evaluator's exception (which may hold policy
# output, NUL included) or a file the policy made (os.listdir gives a lone surrogate for a name that
# is not UTF-8). PostgreSQL refused the NUL and both drivers the surrogate, so the rollout stayed
# running; now every backend stores the same visible escape.
UNSTORABLE_ERRORS = [
    ("evaluator failed: policy said a\x00b", "evaluator failed: policy said a\\x00b"),
    ("evaluator failed: no such file out\udcff.txt", "evaluator failed: no such file out\\udcff.txt"),
]


@pytest.mark.parametrize(("error", "stored"), UNSTORABLE_ERRORS, ids=["nul", "surrogate"])
def test_an_error_text_no_backend_can_store_is_escaped_and_the_rollout_still_ends(
    store: Store, error: str, stored: str
) -> None:
    finished = store.start_rollout(store.create_rollout().rollout_id)
    done = store.finish_rollout(finished.rollout_id, Outcome.INFRA_FAILURE, 0.0, error=error, attempt=0)
    assert done.status is S.FAILED and done.error == stored
    assert store.get_rollout(finished.rollout_id) == done

    requeued = store.create_rollout()
    store.claim_rollouts("w1", 1)
    again = store.requeue_rollout(requeued.rollout_id, error=error, attempt=0)
    assert again.status is S.QUEUED and again.attempt == 1 and again.error == stored
    assert store.get_rollout(requeued.rollout_id) == again

    voided = store.void_rollout(finished.rollout_id, flag="tamper_finished", error=error)
    assert voided.error == stored and store.get_rollout(finished.rollout_id).error == stored


@pytest.mark.parametrize("bad", ["a\x00b", "a\udcffb"], ids=["nul", "surrogate"])
def test_an_id_no_backend_can_store_is_a_bad_request_on_every_backend(store: Store, bad: str) -> None:
    """Names and ids are refused rather than altered (an altered id would name something else): a
    ``BadRequest`` naming the field, alike on every backend, never a driver's error; nothing is written."""
    from harnessrl.schemas import ToolRequest
    from harnessrl.store.gate import GatewayRow

    rollout = store.start_rollout(store.create_rollout(rollout_id="r-ok").rollout_id)
    refused: dict[str, Callable[[], Any]] = {
        "rollout_id": lambda: store.create_rollout(rollout_id=bad),
        "group_id": lambda: store.create_rollout(group_id=bad),
        "run_id": lambda: store.create_run(bad),
        "task_id": lambda: store.add_tasks([Task(task_id=bad, data={})]),
        "worker_id": lambda: store.claim_rollouts(bad, 1),
        "finish_reason": lambda: store.add_call(make_call(rollout.rollout_id, finish_reason=bad)),
        "tool": lambda: store.add_tool_request(ToolRequest(rollout_id=rollout.rollout_id, tool=bad)),
        "checkpoint": lambda: store.add_policy_version(PolicyVersion(version=1, checkpoint=bad)),
        "gateway_id": lambda: store.beat(
            GatewayRow(bad, "", 0, False, True, 0, 0, 0, 0.0, 0.0), notify=False
        ),
    }
    for field, write in refused.items():
        with pytest.raises(BadRequest, match=f"^{field} must not contain NUL") as caught:
            write()
        assert caught.value.param == field
    lookups: dict[str, Callable[[], Any]] = {
        "rollout_id": lambda: store.get_rollout(bad),
        "group_id": lambda: store.list_rollouts(group_id=bad),
        "run_id": lambda: store.get_run(bad),
    }
    for field, read in lookups.items():
        with pytest.raises(BadRequest, match=f"^{field} must not contain NUL"):
            read()
    with pytest.raises(NotFound):
        store.get_rollout_by_key(bad)
    [kept, failed] = store.add_calls(
        [make_call(rollout.rollout_id), make_call(rollout.rollout_id, finish_reason=bad)]
    )
    assert isinstance(kept, Call) and isinstance(failed, BadRequest)  # a group commit: it fails alone
    assert [r.rollout_id for r in store.list_rollouts()] == ["r-ok"]
    assert store.count_calls() == 1 and store.list_runs() == [] and store.list_tasks() == []
    assert store.list_tool_requests(rollout.rollout_id) == [] and store.list_policy_versions() == []
    assert store.list_gateways() == []


def test_cancel_sets_finished_at(store: Store) -> None:
    cancelled = store.cancel_rollout(store.create_rollout().rollout_id)
    assert cancelled.status is S.CANCELLED and cancelled.finished_at is not None


# -- claiming -------------------------------------------------------------------------------------


def test_claim_oldest_first(store: Store) -> None:
    ids = [store.create_rollout(run_id="a" if i % 2 else "b").rollout_id for i in range(6)]
    store.cancel_rollout(ids[0])
    first = store.claim_rollouts("w1", 2)
    assert [r.rollout_id for r in first] == ids[1:3]
    assert all(r.status is S.RUNNING and r.worker_id == "w1" and r.started_at for r in first)
    assert [r.rollout_id for r in store.claim_rollouts("w2", 5, run_id="a")] == [ids[3], ids[5]]
    assert [r.rollout_id for r in store.claim_rollouts("w3", 5)] == [ids[4]]
    assert store.claim_rollouts("w3", 5) == [] and store.claim_rollouts("w3", 0) == []
    assert store.get_rollout(ids[1]).worker_id == "w1"


def test_requeued_rollout_is_claimed_again(store: Store) -> None:
    rollout = store.create_rollout()
    store.claim_rollouts("w1", 1)
    store.requeue_rollout(rollout.rollout_id)
    [again] = store.claim_rollouts("w2", 1)
    assert (again.rollout_id, again.worker_id, again.attempt) == (rollout.rollout_id, "w2", 1)


# -- listing --------------------------------------------------------------------------------------


def test_list_and_count_rollouts(store: Store) -> None:
    made = [
        store.create_rollout(run_id=f"run{i % 2}", step=i // 4, group_id=f"g{i // 2}").rollout_id
        for i in range(8)
    ]
    store.start_rollout(made[1])
    store.finish_rollout(made[2], Outcome.SUCCESS, 1.0)
    store.cancel_rollout(made[3])

    def ids(**filters: Any) -> list[str]:
        return [r.rollout_id for r in store.list_rollouts(**filters)]

    assert ids() == made
    assert ids(run_id="run1") == made[1::2]
    assert ids(status=S.QUEUED) == [made[0], *made[4:]]
    assert ids(status="running") == [made[1]]  # plain strings work too
    assert ids(status=[S.FINISHED, S.CANCELLED]) == made[2:4]
    assert ids(status=[]) == []
    assert ids(step=1) == made[4:]
    assert ids(group_id="g1") == made[2:4]
    assert ids(run_id="run0", step=1, status=S.QUEUED) == [made[4], made[6]]
    assert ids(limit=3) == made[:3]
    assert ids(limit=3, offset=3) == made[3:6]
    assert ids(offset=6) == made[6:]
    assert ids(limit=0) == []
    assert ids(run_id="nope") == []
    assert store.count_rollouts() == 8
    assert store.count_rollouts(run_id="run0") == 4
    assert store.count_rollouts(status=[S.QUEUED, S.RUNNING]) == 6
    assert store.count_rollouts(step=0, status=S.FINISHED) == 1


@pytest.mark.parametrize("window", [{"limit": -1}, {"offset": -1}, {"limit": 2, "offset": -3}])
def test_a_negative_limit_or_offset_is_a_bad_request_on_every_backend(store: Store, window: Any) -> None:
    """SQLite took ``LIMIT -1`` for no limit and a negative offset for none, while PostgreSQL raised
    psycopg's own error: the same call listed every rollout on one backend and was a traceback on
    the other. Both now refuse it with ``BadRequest`` naming the parameter."""
    made = [store.create_rollout().rollout_id for _ in range(3)]
    assert [r.rollout_id for r in store.list_rollouts(limit=2, offset=1)] == made[1:]  # the control
    with pytest.raises(BadRequest, match=f"{next(k for k, v in window.items() if v < 0)} must be"):
        store.list_rollouts(**window)


def test_flags_and_metadata(store: Store) -> None:
    rollout = store.create_rollout(metadata={"a": 1, "nested": {"x": 1}})
    store.set_rollout_flags(rollout.rollout_id, ["git_log", "network"])
    assert store.get_rollout(rollout.rollout_id).flags == ["git_log", "network"]
    store.set_rollout_flags(rollout.rollout_id, ["curl"])  # set, not append
    assert store.get_rollout(rollout.rollout_id).flags == ["curl"]
    updated = store.update_rollout_metadata(rollout.rollout_id, {"b": 2, "nested": {"y": 2}})
    assert updated.metadata == {"a": 1, "b": 2, "nested": {"y": 2}}  # shallow merge
    assert store.get_rollout(rollout.rollout_id) == updated
    finished = store.finish_rollout(rollout.rollout_id, Outcome.SUCCESS, 1.0)
    assert store.update_rollout_metadata(rollout.rollout_id, {"c": 3}).metadata["c"] == 3  # terminal ok
    assert finished.flags == ["curl"]


# -- calls ----------------------------------------------------------------------------------------


def test_add_and_list_calls(store: Store) -> None:
    a, b = store.create_rollout(), store.create_rollout()
    added = [store.add_call(make_call(a.rollout_id, attempt=i // 2)) for i in range(5)]
    assert [c.seq for c in added] == [0, 1, 2, 3, 4]
    assert all(c.call_id for c in added) and len({c.call_id for c in added}) == 5
    mine = store.add_call(make_call(b.rollout_id, call_id="my-call"))
    assert (mine.seq, mine.call_id) == (0, "my-call")
    assert store.list_calls(a.rollout_id) == added
    assert store.list_calls(a.rollout_id, attempt=1) == added[2:4]
    assert store.list_calls(a.rollout_id, attempt=7) == []
    assert store.list_calls(b.rollout_id) == [mine]
    assert store.count_calls(a.rollout_id) == 5 and store.count_calls() == 6


# -- a rollout that ended takes no more calls (issue 36) -------------------------------------------


ENDINGS: dict[str, Callable[[Store, str], Any]] = {
    "finish": lambda s, rid: s.finish_rollout(rid, Outcome.SUCCESS, 1.0),
    "infra_failure": lambda s, rid: s.finish_rollout(rid, Outcome.INFRA_FAILURE, 0.0),
    "cancel": lambda s, rid: s.cancel_rollout(rid),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_an_ended_rollout_takes_no_more_calls(store: Store, ending: str) -> None:
    rollout = store.start_rollout(store.create_rollout().rollout_id)
    before = store.add_call(make_call(rollout.rollout_id))  # control: the same write is taken while running
    ENDINGS[ending](store, rollout.rollout_id)
    with pytest.raises(RolloutEnded, match="takes no more calls"):
        store.add_call(make_call(rollout.rollout_id))
    # In a group commit the late call fails alone; the other rollout's call is written.
    other = store.create_rollout()
    late, kept = store.add_calls([make_call(rollout.rollout_id), make_call(other.rollout_id)])
    assert isinstance(late, RolloutEnded) and isinstance(kept, Call)
    assert store.list_calls(rollout.rollout_id) == [before]
    assert isinstance(RolloutEnded("x"), InvalidTransition)  # a 409 wherever it surfaces


def test_a_superseded_attempt_takes_no_more_calls(store: Store) -> None:
    rollout = store.start_rollout(store.create_rollout().rollout_id)
    store.add_call(make_call(rollout.rollout_id, attempt=0))
    store.requeue_rollout(rollout.rollout_id)  # attempt 0's harness failed; attempt 1 is queued
    with pytest.raises(RolloutEnded):
        store.add_call(make_call(rollout.rollout_id, attempt=0))
    assert store.add_call(make_call(rollout.rollout_id, attempt=1)).seq == 1  # control: the new attempt's


def test_rollout_end_watchers_hear_every_ending_write(store: Store) -> None:
    heard: list[str] = []
    stop = store.watch_rollout_ends(heard.append)
    ids = [store.start_rollout(store.create_rollout().rollout_id).rollout_id for _ in range(4)]
    store.finish_rollout(ids[0], Outcome.SUCCESS, 1.0)
    store.cancel_rollout(ids[1])
    store.requeue_rollout(ids[2])
    store.void_rollout(ids[0], flag="tamper", error="x")
    store.update_rollout_metadata(ids[3], {"k": 1})  # control: not an ending
    store.add_call(make_call(ids[3]))
    with pytest.raises(InvalidTransition):
        store.cancel_rollout(ids[1])  # a refused transition commits nothing: not heard
    assert heard == [ids[0], ids[1], ids[2], ids[0]]
    stop()
    store.cancel_rollout(ids[3])
    assert heard == [ids[0], ids[1], ids[2], ids[0]]


def test_a_failing_watcher_does_not_fail_the_write(store: Store) -> None:
    def broken(rollout_id: str) -> None:
        raise RuntimeError("boom")

    store.watch_rollout_ends(broken)
    rollout = store.create_rollout()
    assert store.cancel_rollout(rollout.rollout_id).status is S.CANCELLED


def test_dropped_calls_are_counted_per_reason(store: Store) -> None:
    rollout = store.create_rollout(metadata={"kind": "train"})
    store.count_dropped_call(rollout.rollout_id, "client_gone")
    store.count_dropped_call(rollout.rollout_id, "client_gone")
    store.finish_rollout(rollout.rollout_id, Outcome.SUCCESS, 1.0, metadata={"evaluation": {}})
    counted = store.count_dropped_call(rollout.rollout_id, "rollout_ended")  # after the end too
    assert counted.metadata == {
        "kind": "train",
        "evaluation": {},
        DROPPED_CALLS_KEY: {"client_gone": 2, "rollout_ended": 1},
    }
    assert store.get_rollout(rollout.rollout_id) == counted
    with pytest.raises(NotFound):
        store.count_dropped_call("nope", "client_gone")


def test_call_fields_round_trip(store: Store) -> None:
    rollout = store.create_rollout()
    call = make_call(
        rollout.rollout_id,
        api="messages",
        request={"model": "m", "messages": [{"role": "user", "content": "héllo ☃ \u0000"}], "t": 0.7},
        response={"content": [{"type": "tool_use", "input": {"cmd": "ls"}}], "stop": None},
        policy_version=12,
        finish_reason="tool_calls",
        usage=Usage(prompt_tokens=3, completion_tokens=2),
        started_at=1.5,
        first_token_at=1.75,
        finished_at=2.0,
        attempt=2,
    )
    stored = store.add_call(call)
    assert stored == call.model_copy(update={"seq": 0, "call_id": stored.call_id})
    assert store.list_calls(rollout.rollout_id) == [stored]
    no_usage = store.add_call(make_call(rollout.rollout_id))
    assert no_usage.usage is None and store.list_calls(rollout.rollout_id)[1] == no_usage


def test_token_ids_must_fit_int32(store: Store) -> None:
    rollout = store.create_rollout()
    too_big = make_call(rollout.rollout_id, prompt_token_ids=[2**31])
    with pytest.raises(BadRequest, match="int32"):
        store.add_call(too_big)
    assert store.count_calls() == 0
    assert store.add_call(make_call(rollout.rollout_id)).seq == 0  # a refused call takes no seq


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.lists(st.integers(0, 2**31 - 1), max_size=300),
    response=st.lists(st.integers(0, 2**31 - 1), max_size=50),
    logprobs=st.lists(st.floats(width=64), max_size=50),  # nan, inf and -0.0 included
    request=st.dictionaries(st.text(), json_values, max_size=4),
)
def test_call_round_trip_is_exact(
    store: Store,
    prompt: list[int],
    response: list[int],
    logprobs: list[float],
    request: dict[str, Any],
) -> None:
    rollout = store.create_rollout()
    call = make_call(
        rollout.rollout_id,
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_logprobs=logprobs,
        request=request,
        response={"echo": request},
    )
    store.add_call(call)
    [got] = store.list_calls(rollout.rollout_id)
    assert got.prompt_token_ids == prompt and got.response_token_ids == response
    # Compare bits, not values: nan != nan, and -0.0 == 0.0 would hide a lost sign.
    assert array("d", got.response_logprobs).tobytes() == array("d", logprobs).tobytes()
    assert all(type(x) is float for x in got.response_logprobs)
    assert got.request == request and got.response == {"echo": request}


# -- policy versions ------------------------------------------------------------------------------


def test_policy_versions(store: Store) -> None:
    assert store.latest_policy_version() is None and store.list_policy_versions() == []
    v2 = PolicyVersion(version=2, step=2, checkpoint="/ckpt/2", metadata={"loss": 0.5})
    v0 = PolicyVersion(version=0)
    store.add_policy_version(v2)
    store.add_policy_version(v0)
    assert store.latest_policy_version() == v2
    assert store.list_policy_versions() == [v0, v2]
    v2b = PolicyVersion(version=2, step=3, checkpoint="/ckpt/2b")
    store.add_policy_version(v2b)  # upsert by version
    assert store.list_policy_versions() == [v0, v2b]


# -- persistence ----------------------------------------------------------------------------------


def test_data_survives_reopening(shared_store_factory: Any) -> None:
    first = shared_store_factory()
    rollout = first.create_rollout(task={"q": 1})
    call = first.add_call(make_call(rollout.rollout_id))
    first.add_policy_version(PolicyVersion(version=1))
    first.close()
    second = shared_store_factory()
    assert second.get_rollout_by_key(rollout.api_key) == rollout
    assert second.list_calls(rollout.rollout_id) == [call]
    assert second.latest_policy_version() is not None
    assert second.add_call(make_call(rollout.rollout_id)).seq == 1


def test_tool_requests_are_kept_per_rollout_and_attempt_in_arrival_order(store: Store) -> None:
    from harnessrl.schemas import ToolRequest

    store.create_rollout(task={"prompt": "q"}, rollout_id="tr-1")
    store.create_rollout(task={"prompt": "q"}, rollout_id="tr-2")
    passages = [{"id": "p", "title": "Velmora", "text": "é \u0000-free ✓", "score": 1.5}]
    for attempt, query in [(0, "first"), (1, "second"), (0, "third")]:
        store.add_tool_request(
            ToolRequest(
                rollout_id="tr-1",
                attempt=attempt,
                tool="search",
                request={"query": query},
                response={"passages": passages},
                started_at=1.0,
                finished_at=2.0,
            )  # fmt: skip
        )
    store.add_tool_request(ToolRequest(rollout_id="tr-2", tool="search", request={"query": "other"}))
    assert [r.request["query"] for r in store.list_tool_requests("tr-1")] == ["first", "second", "third"]
    assert [r.request["query"] for r in store.list_tool_requests("tr-1", attempt=0)] == ["first", "third"]
    assert store.list_tool_requests("tr-1")[0].response == {"passages": passages}
    assert [r.request["query"] for r in store.list_tool_requests("tr-2")] == ["other"]
    assert store.list_tool_requests("no-such-rollout") == []


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_an_ended_rollout_or_superseded_attempt_takes_no_more_tool_requests(
    store: Store, ending: str
) -> None:
    """As ``add_call``: a search still running when its rollout (or attempt) ended is refused under
    the lock the ending write takes, never recorded after the end."""
    from harnessrl.schemas import ToolRequest

    def search(rollout_id: str, attempt: int, query: str) -> ToolRequest:
        return ToolRequest(rollout_id=rollout_id, attempt=attempt, tool="search", request={"query": query})

    ended = store.start_rollout(store.create_rollout().rollout_id)
    store.add_tool_request(search(ended.rollout_id, 0, "before"))  # control: taken while running
    ENDINGS[ending](store, ended.rollout_id)
    with pytest.raises(RolloutEnded, match="takes no more tool requests"):
        store.add_tool_request(search(ended.rollout_id, 0, "late"))
    assert [r.request["query"] for r in store.list_tool_requests(ended.rollout_id)] == ["before"]

    requeued = store.start_rollout(store.create_rollout().rollout_id)
    store.requeue_rollout(requeued.rollout_id)  # attempt 0's harness failed; attempt 1 is queued
    with pytest.raises(RolloutEnded):
        store.add_tool_request(search(requeued.rollout_id, 0, "stale"))
    store.add_tool_request(search(requeued.rollout_id, 1, "current"))  # control: the new attempt's
    assert [r.request["query"] for r in store.list_tool_requests(requeued.rollout_id)] == ["current"]
    with pytest.raises(NotFound):
        store.add_tool_request(search("no-such-rollout", 0, "x"))


#: Each store method given an integer no 64-bit column holds, and the field the error must name.
OUT_OF_RANGE: dict[str, tuple[str, Callable[[Store, str], Any]]] = {
    "create_rollout step": ("step", lambda s, r: s.create_rollout(step=2**63)),
    "add_call attempt": ("attempt", lambda s, r: s.add_call(make_call(r, attempt=2**63))),
    "add_call policy_version": (
        "policy_version",
        lambda s, r: s.add_call(make_call(r, policy_version=2**63)),
    ),
    "add_calls policy_version": (
        "policy_version",
        lambda s, r: _raise_first(s.add_calls([make_call(r, policy_version=-(2**63) - 1)])),
    ),
    "add_policy_version version": (
        "version",
        lambda s, r: s.add_policy_version(PolicyVersion(version=2**63)),
    ),
    "add_policy_version step": (
        "step",
        lambda s, r: s.add_policy_version(PolicyVersion(version=1, step=2**64)),
    ),
    "list_rollouts step": ("step", lambda s, r: s.list_rollouts(step=2**63)),
    "list_rollouts limit": ("limit", lambda s, r: s.list_rollouts(limit=2**63)),
    "list_rollouts offset": ("offset", lambda s, r: s.list_rollouts(offset=2**63)),
    "count_rollouts step": ("step", lambda s, r: s.count_rollouts(step=-(2**63) - 1)),
    "claim_rollouts limit": ("limit", lambda s, r: s.claim_rollouts("w", 2**63)),
    "list_calls attempt": ("attempt", lambda s, r: s.list_calls(r, attempt=2**63)),
    "add_tool_request attempt": (
        "attempt",
        lambda s, r: s.add_tool_request(
            ToolRequest(
                rollout_id=r,
                attempt=2**63,
                tool="search",
                request={},
                response={},
                started_at=0,
                finished_at=0,
            )
        ),
    ),
    "list_tool_requests attempt": ("attempt", lambda s, r: s.list_tool_requests(r, attempt=2**63)),
    "command_gate policy_version": (
        "policy_version",
        lambda s, r: s.command_gate(paused=True, policy_version=2**63),
    ),
}


def _raise_first(results: list[Any]) -> None:
    if isinstance(results[0], Exception):
        raise results[0]


@pytest.mark.parametrize("case", list(OUT_OF_RANGE))
def test_an_integer_past_64_bits_is_a_bad_request_naming_it_on_every_backend(store: Store, case: str) -> None:
    """SQLite raised ``OverflowError`` and PostgreSQL ``NumericValueOutOfRange`` ("bigint out of
    range"), or answered a filter with nothing: the same call was a different driver traceback on
    each backend. Each is now a ``BadRequest`` naming the field, and nothing is written."""
    field, use = OUT_OF_RANGE[case]
    rollout = store.create_rollout(step=2**63 - 1)  # the control: the largest value that fits is stored
    assert store.get_rollout(rollout.rollout_id).step == 2**63 - 1
    assert store.add_call(make_call(rollout.rollout_id, policy_version=-(2**63))).policy_version == -(2**63)
    with pytest.raises(BadRequest, match=rf"^{field} must be") as refused:
        use(store, rollout.rollout_id)
    assert refused.value.param == field
    assert store.count_rollouts() == 1 and store.count_calls() == 1
    assert store.list_policy_versions() == [] and store.read_gate().command == 0


def test_a_duplicate_call_id_is_a_conflict_on_every_backend(store: Store) -> None:
    """A call_id already recorded raised ``sqlite3.IntegrityError`` on SQLite and psycopg's
    ``UniqueViolation`` on PostgreSQL; both now raise ``Conflict`` naming it, in ``add_call`` and in
    its place in ``add_calls``, and the first call is kept as it was."""
    rollout = store.create_rollout()
    first = store.add_call(make_call(rollout.rollout_id, call_id="dup"))
    with pytest.raises(Conflict, match="call_id 'dup' is already recorded"):
        store.add_call(make_call(rollout.rollout_id, call_id="dup", prompt_token_ids=[9]))
    results = store.add_calls(
        [make_call(rollout.rollout_id, call_id="dup"), make_call(rollout.rollout_id, call_id="new")]
    )
    assert isinstance(results[0], Conflict) and "dup" in str(results[0])
    assert isinstance(results[1], Call) and results[1].seq == 1  # the control: the other call is added
    assert store.list_calls(rollout.rollout_id) == [first, results[1]]
