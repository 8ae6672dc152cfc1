"""The controller loop when its own side fails: the store unreadable a moment (a database restart, a
lock timeout), two controllers sharing a process, and retries counted across shutdowns. Real
sandboxed harnesses, a real SQLite store made to fail on the calls named."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from tests.controller.test_controller_loop import MARK, harness_processes, make_controller

from harnessrl.controller.retries import INFRA_FAILURES_KEY
from harnessrl.controller.tamper import VOIDED_FINISH_KEY
from harnessrl.schemas import Outcome, RolloutStatus
from harnessrl.store.sqlite import SQLiteStore

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")

# Only ends a hung test: every wait below is for a state.
PATIENCE_S = 60


class FlakyStore(SQLiteStore):
    """A SQLite store whose named methods raise ``sqlite3.OperationalError`` while ``failing[name]``
    is above zero (counted down by each failure), as a database that went away for a moment does."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.failing: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self._lock = threading.Lock()

    def _maybe_fail(self, name: str) -> None:
        with self._lock:
            if self.failing.get(name, 0) > 0:
                self.failing[name] -= 1
                self.failed[name] = self.failed.get(name, 0) + 1
                raise sqlite3.OperationalError("database is locked")

    def list_calls(self, *args, **kwargs):
        self._maybe_fail("list_calls")
        return super().list_calls(*args, **kwargs)

    def claim_rollouts(self, *args, **kwargs):
        self._maybe_fail("claim_rollouts")
        return super().claim_rollouts(*args, **kwargs)

    def get_rollout(self, *args, **kwargs):
        self._maybe_fail("get_rollout")
        return super().get_rollout(*args, **kwargs)

    def update_rollout_metadata(self, *args, **kwargs):
        self._maybe_fail("update_rollout_metadata")
        return super().update_rollout_metadata(*args, **kwargs)


async def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not predicate():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        await asyncio.sleep(0.05)


def run_until_finished(controller, store, rid: str) -> None:  # noqa: ANN001
    """Run ``controller``'s loop until rollout ``rid`` is finished, then stop it."""

    async def go():
        stop = asyncio.Event()
        loop = asyncio.create_task(controller.run_forever(stop))
        try:
            await wait_for(
                lambda: store.get_rollout(rid).status is RolloutStatus.FINISHED, "the rollout to finish"
            )
        finally:
            stop.set()
            await loop

    asyncio.run(go())


def test_a_store_error_after_the_harness_ran_ends_the_attempt_not_the_rollout_record(tmp_path):
    """The store failed once while the controller read the attempt's calls: the task died with the
    exception and the rollout stayed ``running`` with nothing running it, until the controller shut
    down. Now that attempt is an infrastructure failure and the next one scores the rollout."""
    store = FlakyStore(tmp_path / "db.sqlite")
    rid = store.create_rollout(task={}).rollout_id
    store.failing["list_calls"] = 1
    controller = make_controller(store, tmp_path, ["true"], max_infra_retries=2)

    run_until_finished(controller, store, rid)
    rollout = store.get_rollout(rid)
    assert store.failed == {"list_calls": 1}
    assert rollout.attempt == 1 and rollout.reward == 1.0 and rollout.outcome.value == "success"
    assert "OperationalError" in (rollout.error or "")
    assert rollout.metadata[INFRA_FAILURES_KEY] == 1


def test_an_attempt_the_store_could_not_end_is_ended_once_it_can(tmp_path):
    """The store still failing when the controller came to record the failed attempt: recorded at a
    later poll (the rollout never stays ``running`` with nothing running it)."""
    store = FlakyStore(tmp_path / "db.sqlite")
    rid = store.create_rollout(task={}).rollout_id
    store.failing.update(list_calls=1, update_rollout_metadata=1)
    controller = make_controller(store, tmp_path, ["true"], max_infra_retries=2)

    run_until_finished(controller, store, rid)
    rollout = store.get_rollout(rid)
    assert store.failed == {"list_calls": 1, "update_rollout_metadata": 1}
    assert rollout.attempt == 1 and rollout.reward == 1.0 and "OperationalError" in (rollout.error or "")


def test_a_store_error_while_claiming_leaves_running_attempts_alone(tmp_path):
    """A failed claim used to end ``run_forever``, and its shutdown killed and requeued every running
    attempt: one database blip threw away all the work in flight."""
    store = FlakyStore(tmp_path / "db.sqlite")
    rid = store.create_rollout(task={}).rollout_id
    go_file = tmp_path / "go"
    # No sandbox: the harness waits for a file outside its workspace (what the sandbox hides).
    command = ["sh", "-c", f"while [ ! -e {go_file} ]; do sleep 0.05; done"]
    controller = make_controller(store, tmp_path, command, sandbox="none", timeout_s=PATIENCE_S * 2)

    async def go():
        stop = asyncio.Event()
        loop = asyncio.create_task(controller.run_forever(stop))
        try:
            await wait_for(lambda: store.get_rollout(rid).status is RolloutStatus.RUNNING, "the claim")
            store.failing["claim_rollouts"] = 2
            await wait_for(
                lambda: store.failed.get("claim_rollouts") == 2 or loop.done(), "two failed claims"
            )
            assert not loop.done(), "a failed claim ended the controller loop"
            go_file.touch()
            await wait_for(
                lambda: store.get_rollout(rid).status is RolloutStatus.FINISHED, "the rollout to finish"
            )
        finally:
            go_file.touch()
            stop.set()
            await asyncio.gather(loop, return_exceptions=True)

    asyncio.run(go())
    rollout = store.get_rollout(rid)
    assert rollout.attempt == 0 and rollout.reward == 1.0 and rollout.error is None


def test_a_cancel_after_a_store_error_still_kills_the_harness(tmp_path):
    """The watcher that kills a cancelled rollout's harness died of one failed store read; a cancel
    after that left the harness running to its deadline."""
    store = FlakyStore(tmp_path / "db.sqlite")
    rid = store.create_rollout(task={}).rollout_id
    controller = make_controller(store, tmp_path, ["sleep", f"{MARK}7"], timeout_s=PATIENCE_S * 4)

    async def go():
        stop = asyncio.Event()
        loop = asyncio.create_task(controller.run_forever(stop))
        try:
            await wait_for(lambda: harness_processes(f"sleep {MARK}7"), "the harness to start")
            store.failing["get_rollout"] = 1  # only the watcher reads the rollout while it runs
            await wait_for(lambda: store.failed.get("get_rollout") == 1, "the watcher's failed read")
            store.cancel_rollout(rid)
            await wait_for(lambda: not harness_processes(f"sleep {MARK}7"), "the cancelled harness to die")
        finally:
            stop.set()
            await loop

    asyncio.run(go())
    assert store.get_rollout(rid).status is RolloutStatus.CANCELLED
    assert harness_processes(f"sleep {MARK}7") == []


def test_one_controller_stopping_leaves_another_in_its_process_alone(tmp_path):
    """Two controllers in one process (or two containers on one host, each pid 1) had one worker id,
    ``host-pid``: the one that stopped requeued the rollouts the other was running, which killed
    them and started them over."""
    store = SQLiteStore(tmp_path / "db.sqlite")
    rid = store.create_rollout(task={}).rollout_id
    go_file = tmp_path / "go"
    command = ["sh", "-c", f"while [ ! -e {go_file} ]; do sleep 0.05; done"]
    busy = make_controller(store, tmp_path / "busy", command, sandbox="none", timeout_s=PATIENCE_S * 2)
    idle = make_controller(SQLiteStore(tmp_path / "db.sqlite"), tmp_path / "idle", ["true"])
    assert busy.worker_id != idle.worker_id

    async def go():
        run = asyncio.create_task(busy.run_until_done([rid], timeout_s=PATIENCE_S))
        try:
            await wait_for(lambda: store.get_rollout(rid).status is RolloutStatus.RUNNING, "the claim")
            await idle.shutdown()
            during = store.get_rollout(rid)
            go_file.touch()
            [done] = await run
            return during, done
        finally:
            go_file.touch()
            await asyncio.gather(run, return_exceptions=True)
            await busy.shutdown()

    during, done = asyncio.run(go())
    assert during.status is RolloutStatus.RUNNING and during.attempt == 0
    assert done.status is RolloutStatus.FINISHED and done.attempt == 0 and done.error is None


def test_attempts_a_shutdown_ended_do_not_use_up_infra_retries(tmp_path):
    """``max_infra_retries`` was compared with the attempt number, which also counts the attempts a
    Ctrl-C (or a restarted trainer) requeued: a rollout interrupted twice failed for good at its
    first infrastructure failure, with none of its retries used."""
    store = SQLiteStore(tmp_path / "db.sqlite")
    rid = store.create_rollout(task={}).rollout_id
    for _ in range(2):  # two controllers stopped while they ran it
        [claimed] = store.claim_rollouts("gone", 1)
        store.requeue_rollout(rid, error="controller shut down", attempt=claimed.attempt)
    # The scorer crashes on every input (json.loads of an EvaluationInput): every attempt is an
    # infrastructure failure. (A task lacking a field the scorer names now fails at once, unretried.)
    controller = make_controller(
        store, tmp_path, ["true"], evaluator={"type": "python", "function": "json:loads"}, max_infra_retries=1
    )
    [rollout] = asyncio.run(controller.run_until_done([rid], timeout_s=PATIENCE_S))
    asyncio.run(controller.shutdown())
    assert rollout.status is RolloutStatus.FAILED and rollout.outcome.value == "infra_failure"
    assert rollout.attempt == 3  # attempts 2 and 3: the first failure and its one retry
    assert rollout.metadata[INFRA_FAILURES_KEY] == 2
    assert "evaluator failed" in (rollout.error or "")


TAMPERED_METADATA = {"calls_seen": 0, "sampled_by_discarded_weights": {"step": 1}}


@pytest.mark.parametrize(
    ("outcome", "reward", "evaluator"),
    [
        # Declared an infrastructure failure (status failed): out of its group's baseline, unflagged.
        ("infra_failure", 0.0, None),
        # Finished itself with full marks, then made the scoring fail (here: a scorer that crashes):
        # the ended rollout refused the controller's retry, and the 1.0 stood.
        ("success", 1.0, {"type": "python", "function": "json:loads"}),
    ],
)
def test_a_rollout_ended_behind_the_controllers_back_is_void_whatever_it_claims(
    tmp_path, outcome, reward, evaluator
):
    """The agent with a stolen admin key ends its own rollout while its harness runs (done here by the
    test, through the store): only ``success``-like ends were voided as ``tamper_finished``."""
    store = SQLiteStore(tmp_path / "db.sqlite")
    rid = store.create_rollout(task={}).rollout_id
    go_file = tmp_path / "go"
    command = ["sh", "-c", f"while [ ! -e {go_file} ]; do sleep 0.05; done; exit 1"]
    controller = make_controller(store, tmp_path, command, sandbox="none", evaluator=evaluator)

    async def go():
        run = asyncio.create_task(controller.run_until_done([rid], timeout_s=PATIENCE_S))
        try:
            await wait_for(lambda: store.get_rollout(rid).status is RolloutStatus.RUNNING, "the claim")
            # With metadata that would keep the void 0 out of training (``calls_seen`` 0: no call
            # trained; a lost-weights mark: out of its group), kept by the void before.
            store.finish_rollout(rid, Outcome(outcome), reward, metadata=TAMPERED_METADATA)
            go_file.touch()
            [done] = await run
            return done
        finally:
            go_file.touch()
            await asyncio.gather(run, return_exceptions=True)
            await controller.shutdown()

    rollout = asyncio.run(go())
    assert rollout.status is RolloutStatus.FINISHED and rollout.attempt == 0
    assert rollout.outcome.value == "policy_failure" and rollout.reward == 0.0
    assert rollout.flags == ["tamper_finished"]
    assert not set(TAMPERED_METADATA) & set(rollout.metadata), rollout.metadata
    assert rollout.metadata[VOIDED_FINISH_KEY] == {"outcome": outcome, "reward": reward}


class HeldClaimStore(SQLiteStore):
    """A store whose first claim waits until someone lists the rollouts (or a while has passed): a
    claim still in its thread when the controller's loop is cancelled and it shuts down."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.claim_entered = threading.Event()
        self.claim_done = threading.Event()
        self.listed = threading.Event()

    def claim_rollouts(self, *args, **kwargs):
        if self.claim_entered.is_set():
            return super().claim_rollouts(*args, **kwargs)
        self.claim_entered.set()
        try:
            self.listed.wait(timeout=5)  # only ever a delay: the result is the same either way
            return super().claim_rollouts(*args, **kwargs)
        finally:
            self.claim_done.set()

    def list_rollouts(self, *args, **kwargs):
        self.listed.set()
        return super().list_rollouts(*args, **kwargs)


def test_a_claim_in_flight_when_the_loop_is_cancelled_is_given_back(tmp_path):
    """The loop cancelled (Ctrl-C under ``asyncio.run``, a trainer's task torn down) while its claim
    ran in a thread: the shutdown looked for this controller's rollouts before the claim committed,
    and the claimed rollout stayed ``running`` for good, with nothing running it."""
    store = HeldClaimStore(tmp_path / "db.sqlite")
    rid = store.create_rollout(task={}).rollout_id
    controller = make_controller(store, tmp_path, ["true"])

    async def go():
        loop = asyncio.create_task(controller.run_forever(asyncio.Event()))
        await wait_for(store.claim_entered.is_set, "the claim to start")
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        await wait_for(store.claim_done.is_set, "the claim to end")

    asyncio.run(go())
    rollout = store.get_rollout(rid)
    assert rollout.status is RolloutStatus.QUEUED and rollout.worker_id is None
