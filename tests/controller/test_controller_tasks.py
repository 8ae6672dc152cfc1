"""What the controller does with a rollout it cannot score through no fault of the policy: a task
created through the control API that its harness cannot start on or its evaluator cannot score
(checked once, failed once, never launched), and an attempt whose recorded calls the store cannot
read back (a damaged row: a failure of that attempt named as such, never a crash of the loop); and
the verdict of an attempt superseded while it was scored, which must not touch the next attempt's
record. Real sandboxed harnesses and a real SQLite store."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
from pathlib import Path

import pytest
from tests.controller.test_controller_loop import make_controller

from harnessrl.controller.retries import INFRA_FAILURES_KEY
from harnessrl.controller.stack import RolloutConfig, run_one_rollout
from harnessrl.schemas import Call, Outcome, RolloutStatus
from harnessrl.store.sqlite import SQLiteStore

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")


def test_a_task_the_evaluator_cannot_score_fails_once_and_never_launches(tmp_path):
    """A task from the control API (``store.create_rollout``, as ``POST /api/rollouts`` does) with no
    field the scorer names: each attempt used to launch the harness, then fail in the scorer as an
    infrastructure failure, retried ``max_infra_retries`` times."""
    store = SQLiteStore(tmp_path / "db.sqlite")
    unfit = store.create_rollout(task={"prompt": "p"}).rollout_id
    fits = store.create_rollout(task={"prompt": "p", "hidden": {"tests": "/t"}}).rollout_id  # the control
    controller = make_controller(
        store,
        tmp_path,
        ["sh", "-c", "echo launched > launched"],
        evaluator={
            "type": "command",
            "command": ["sh", "-c", "test -f launched && echo {task[hidden.tests]}"],
        },
        max_infra_retries=2,
    )
    rollouts = asyncio.run(controller.run_until_done([unfit, fits], timeout_s=120))
    asyncio.run(controller.shutdown())
    bad, good = rollouts
    assert good.status is RolloutStatus.FINISHED and good.reward == 1.0
    assert bad.status is RolloutStatus.FAILED and bad.outcome.value == "infra_failure"
    assert bad.attempt == 0 and bad.metadata[INFRA_FAILURES_KEY] == 1
    assert "the task does not fit" in (bad.error or "") and "hidden.tests" in (bad.error or "")
    assert not (tmp_path / "run" / "rollouts" / unfit / "attempt-0" / "workspace" / "launched").exists()


def test_a_task_the_harness_cannot_start_on_fails_once(tmp_path):
    store = SQLiteStore(tmp_path / "db.sqlite")
    rid = store.create_rollout(task={"prompt": "p"}).rollout_id
    controller = make_controller(store, tmp_path, ["echo", "{task[repo_name]}"], max_infra_retries=2)
    [rollout] = asyncio.run(controller.run_until_done([rid], timeout_s=120))
    asyncio.run(controller.shutdown())
    assert rollout.status is RolloutStatus.FAILED and rollout.outcome.value == "infra_failure"
    assert rollout.attempt == 0, rollout.error
    assert "the task does not fit" in (rollout.error or "") and "repo_name" in (rollout.error or "")


class DamagedStore(SQLiteStore):
    """A SQLite store in which attempt 0's recorded call is damaged (its response no longer JSON)
    just before the controller reads the attempt's calls, as a disk or a bad writer might leave it."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.db = path

    def list_calls(self, rollout_id, *, attempt=None):  # noqa: ANN001
        if attempt == 0:
            self.add_call(
                Call(
                    rollout_id=rollout_id,
                    attempt=0,
                    prompt_token_ids=[1, 2],
                    response_token_ids=[3],
                    response_logprobs=[-0.5],
                    request={"messages": []},
                    response={},
                )
            )
            with sqlite3.connect(self.db) as conn:
                conn.execute("UPDATE calls SET response = '{damaged' WHERE rollout_id = ?", (rollout_id,))
        return super().list_calls(rollout_id, attempt=attempt)


@pytest.mark.parametrize("retries", [0, 1])
def test_an_attempt_whose_calls_cannot_be_read_is_a_named_failure_of_that_attempt(tmp_path, retries):
    store = DamagedStore(tmp_path / "db.sqlite")
    rid = store.create_rollout(task={}).rollout_id
    controller = make_controller(store, tmp_path, ["true"], max_infra_retries=retries)
    [rollout] = asyncio.run(controller.run_until_done([rid], timeout_s=120))
    asyncio.run(controller.shutdown())
    assert "cannot read the attempt's recorded calls" in (rollout.error or "")
    assert "JSONDecodeError" in (rollout.error or "")
    if retries:  # the next attempt's calls are its own: scored
        assert rollout.status is RolloutStatus.FINISHED and rollout.attempt == 1 and rollout.reward == 1.0
    else:
        assert rollout.status is RolloutStatus.FAILED and rollout.outcome.value == "infra_failure"


def damage_attempt_0_then_fail(inp, db: str):  # noqa: ANN001, ANN201 - a python evaluator
    """Attempt 0: a call row of it damaged, then the scorer crashes (an infrastructure failure,
    retried); later attempts score 1."""
    store = DamagedStore(Path(db))
    try:
        if store.get_rollout(inp.rollout_id).attempt > 0:
            return 1.0
        with contextlib.suppress(ValueError):
            store.list_calls(inp.rollout_id, attempt=0)  # adds the damaged row
    finally:
        store.close()
    raise RuntimeError("scorer crashed")


def test_harnessrl_rollout_summarises_the_final_attempt_past_an_earlier_damaged_one(tmp_path):
    """``harnessrl rollout`` read every attempt's calls for its summary, and a damaged row of an
    earlier (retried) attempt ended the command with a traceback after the rollout was scored."""
    (tmp_path / "replies.json").write_text(json.dumps({"turns": ["done"]}))
    run_dir = tmp_path / "run"
    config = RolloutConfig.model_validate(
        {
            "engine": {"model": f"scripted:{tmp_path / 'replies.json'}"},
            "harness": {"preset": "python", "command": ["-c", "pass"], "timeout_s": 120},
            "evaluator": {
                "type": "python",
                "function": f"{__name__}:damage_attempt_0_then_fail",
                "kwargs": {"db": str(run_dir / "harnessrl.db")},
            },
            "controller": {"max_infra_retries": 1},
        }
    )
    summary = asyncio.run(run_one_rollout(config, {"prompt": "hi"}, run_dir, timeout_s=300))
    assert summary["status"] == "finished" and summary["reward"] == 1.0 and summary["attempts"] == 2
    assert summary["calls"] == 0 and summary["tokens"] == 0  # the final attempt's, which made none
    store = SQLiteStore(run_dir / "harnessrl.db")
    try:  # the control: attempt 0 really holds a row no reader can decode
        with pytest.raises(ValueError):
            store.list_calls(summary["rollout_id"], attempt=0)
    finally:
        store.close()


async def supersede_while_scoring(inp, db: str):  # noqa: ANN001, ANN201 - a python evaluator
    """Attempt 0's scorer is slow: meanwhile the rollout is requeued (a restarted trainer does that
    to what it finds running) and attempt 1 runs elsewhere and finishes, flagged ``network_fetch``.
    Then attempt 0's verdict comes, with a flag of its scorer's."""
    store = SQLiteStore(Path(db))
    try:
        store.requeue_rollout(inp.rollout_id, error="trainer restarted", attempt=0)
        [claimed] = store.claim_rollouts("another-controller", 1)
        assert claimed.attempt == 1
        store.set_rollout_flags(inp.rollout_id, ["network_fetch"])
        store.finish_rollout(inp.rollout_id, Outcome.SUCCESS, 0.0, metadata={"by": "attempt 1"}, attempt=1)
    finally:
        store.close()
    return {"reward": 1.0, "flags": ["attempt_0_scorer_flag"]}


def test_a_superseded_attempts_verdict_never_overwrites_the_next_attempts_flags(tmp_path):
    """The flags were written before the finish, unguarded: the finish of the superseded attempt was
    refused, but its flags had replaced those of the attempt that ended the rollout."""
    db = tmp_path / "db.sqlite"
    store = SQLiteStore(db)
    rid = store.create_rollout(task={}).rollout_id
    evaluator = {
        "type": "python",
        "function": f"{__name__}:supersede_while_scoring",
        "kwargs": {"db": str(db)},
    }
    controller = make_controller(store, tmp_path, ["true"], evaluator=evaluator)
    [rollout] = asyncio.run(controller.run_until_done([rid], timeout_s=120))
    asyncio.run(controller.shutdown())
    assert rollout.attempt == 1 and rollout.metadata["by"] == "attempt 1"  # attempt 1's end stands
    assert rollout.flags == ["network_fetch"]


def test_the_harness_gets_its_rollout_id_quoted_in_its_base_urls(tmp_path):
    """A rollout id starts with ``run.name``, which may hold ``#``, ``?``, ``%`` or a space: the
    base URLs the harness got carried it as it is, so every model call went to another path (cut at
    ``#`` or ``?``, ``%41`` read as ``A``: a 405 or 403)."""
    from urllib.parse import unquote, urlsplit

    store = SQLiteStore(tmp_path / "db.sqlite")
    rid = store.create_rollout(task={}, rollout_id="exp#2 a%41?-g0-0").rollout_id
    say = 'echo "$OPENAI_BASE_URL"; echo "$ANTHROPIC_BASE_URL"'
    controller = make_controller(store, tmp_path, ["sh", "-c", say], keep_workspaces=True)
    [rollout] = asyncio.run(controller.run_until_done([rid], timeout_s=120))
    asyncio.run(controller.shutdown())
    assert rollout.status is RolloutStatus.FINISHED, rollout.error
    [log] = (tmp_path / "run").rglob("stdout.log")
    openai_url, anthropic_url = log.read_text().split()
    for url, suffix in ((openai_url, "/v1"), (anthropic_url, "")):
        parts = urlsplit(url)
        assert (parts.query, parts.fragment) == ("", ""), url  # nothing of the id cut off
        assert unquote(parts.path) == f"/rollouts/{rid}{suffix}", url
