"""The controller loop with real sandboxed processes: concurrency cap, cancellation, retries only for
infrastructure failures, two controllers sharing a store, and a shutdown that leaves no orphans."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import pytest

from harnessrl.controller.base import HarnessSpec, ResourceLimits
from harnessrl.controller.controller import Controller, ControllerConfig, GatewayEndpoint
from harnessrl.controller.evaluators import build_evaluator
from harnessrl.controller.local import LocalRunner
from harnessrl.schemas import RolloutStatus
from harnessrl.store.sqlite import SQLiteStore

# Sleep durations no other process on the machine uses, so pgrep finds only ours.
MARK = f"{300 + os.getpid() % 1000}.{time.time_ns() % 10**6}"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")


def make_controller(store, tmp_path: Path, command: list[str], *, evaluator=None, **config) -> Controller:
    return Controller(
        store,
        LocalRunner(bridge_path=None),  # these harnesses make no model calls
        gateway=GatewayEndpoint("127.0.0.1", 9),
        harness=HarnessSpec(
            command=command,
            timeout_s=config.pop("timeout_s", 60),
            limits=config.pop("limits", ResourceLimits()),
            sandbox=config.pop("sandbox", "bwrap"),
        ),
        evaluator=build_evaluator(evaluator or {"type": "command", "command": ["true"]}),
        run_dir=tmp_path / "run",
        config=ControllerConfig(poll_interval_s=0.1, **config),
    )


def test_concurrency_cap_is_respected(tmp_path):
    store = SQLiteStore(tmp_path / "db.sqlite")
    ids = [store.create_rollout(task={"i": i}).rollout_id for i in range(5)]
    controller = make_controller(store, tmp_path, ["sleep", "0.6"], concurrency=2)
    peak = 0

    async def go():
        nonlocal peak
        watcher_done = asyncio.Event()

        async def watch():
            nonlocal peak
            while not watcher_done.is_set():
                peak = max(peak, store.count_rollouts(status=RolloutStatus.RUNNING))
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch())
        done = await controller.run_until_done(ids, timeout_s=60)
        watcher_done.set()
        await watcher
        await controller.shutdown()
        return done

    done = asyncio.run(go())
    assert all(r.status is RolloutStatus.FINISHED and r.reward == 1.0 for r in done)
    assert peak == 2


def harness_processes(pattern: str) -> list[str]:
    """The pids of processes whose command line holds ``pattern`` (a harness started, or survived)."""
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()


def test_cancelled_rollout_is_killed(tmp_path):
    store = SQLiteStore(tmp_path / "db.sqlite")
    rid = store.create_rollout(task={}).rollout_id
    controller = make_controller(store, tmp_path, ["sleep", MARK])

    async def go():
        run = asyncio.create_task(controller.run_until_done([rid], timeout_s=30))
        while not harness_processes(f"sleep {MARK}"):  # the harness itself is running
            await asyncio.sleep(0.05)
        store.cancel_rollout(rid)
        [r] = await run
        await controller.shutdown()
        return r

    rollout = asyncio.run(go())
    assert rollout.status is RolloutStatus.CANCELLED
    assert subprocess.run(["pgrep", "-f", f"sleep {MARK}"], capture_output=True).stdout == b""


def test_a_requeued_attempt_is_killed_and_the_next_one_is_judged_alone(tmp_path):
    """A requeue while an attempt runs (a restarted trainer requeues what it finds running, even under
    a live external controller): the superseded attempt's harness is killed, and only the next
    attempt finishes the rollout. The superseded one used to run on, finish the rollout with its own
    result, and have the next attempt void it as ``tamper_finished`` (or the other way round)."""
    store = SQLiteStore(tmp_path / "db.sqlite")
    rid = store.create_rollout(task={}).rollout_id
    # Attempt 0 would work until its deadline, two minutes away; attempt 1 is done at once.
    command = ["sh", "-c", f'[ "$HARNESSRL_ATTEMPT" != 0 ] || exec sleep {MARK}']
    controller = make_controller(store, tmp_path, command, timeout_s=120)

    async def go():
        run = asyncio.create_task(controller.run_until_done([rid], timeout_s=60))
        while not harness_processes(f"sleep {MARK}"):  # attempt 0 is running
            await asyncio.sleep(0.05)
        store.requeue_rollout(rid, error="trainer restarted")
        [r] = await run
        # Before the shutdown (which kills whatever runs): attempt 0 was killed for the requeue, not
        # left to its deadline. A state, not a time: a loaded CI machine once took 10 s where 1 s does.
        deadline = time.monotonic() + 30
        while harness_processes(f"sleep {MARK}") and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        survivors = harness_processes(f"sleep {MARK}")
        await controller.shutdown()
        return r, survivors

    rollout, survivors = asyncio.run(go())
    assert survivors == [], "the superseded attempt's harness ran on"
    assert rollout.status is RolloutStatus.FINISHED and rollout.attempt == 1
    assert rollout.reward == 1.0 and rollout.flags == [] and rollout.error == "trainer restarted"
    assert rollout.metadata["log_dir"].endswith("attempt-1")
    assert harness_processes(f"sleep {MARK}") == []


def test_infrastructure_failures_are_retried_then_recorded(tmp_path):
    store = SQLiteStore(tmp_path / "db.sqlite")
    rid = store.create_rollout(task={}).rollout_id
    # The scorer crashes on every input (json.loads of an EvaluationInput): a broken scorer, not the
    # policy's doing. (A task lacking a field the scorer names is failed once: test_controller_tasks.)
    controller = make_controller(
        store, tmp_path, ["true"], evaluator={"type": "python", "function": "json:loads"}, max_infra_retries=2
    )
    [rollout] = asyncio.run(controller.run_until_done([rid], timeout_s=60))
    asyncio.run(controller.shutdown())
    assert rollout.status is RolloutStatus.FAILED
    assert rollout.outcome.value == "infra_failure"
    assert rollout.attempt == 2
    assert "evaluator failed: json:loads raised TypeError" in (rollout.error or "")
    assert sorted(p.name for p in (tmp_path / "run" / "rollouts" / rid).iterdir()) == [
        "attempt-0",
        "attempt-1",
        "attempt-2",
    ]


def test_a_scorer_exiting_127_is_a_zero_not_a_retry(tmp_path):
    # 127 once meant "the scorer could not run" (retried, left out of the group's baseline): the code
    # the scorer runs can exit with it, so it is now the policy's outcome, flagged.
    store = SQLiteStore(tmp_path / "db.sqlite")
    rid = store.create_rollout(task={}).rollout_id
    controller = make_controller(
        store,
        tmp_path,
        ["true"],
        evaluator={"type": "command", "command": ["sh", "-c", "exit 127"], "reward_from": "json"},
        max_infra_retries=2,
    )
    [rollout] = asyncio.run(controller.run_until_done([rid], timeout_s=60))
    asyncio.run(controller.shutdown())
    assert rollout.status is RolloutStatus.FINISHED and rollout.attempt == 0
    assert rollout.reward == 0.0 and rollout.flags == ["scorer_failed"]


def test_policy_failures_are_not_retried(tmp_path):
    store = SQLiteStore(tmp_path / "db.sqlite")
    rid = store.create_rollout(task={}).rollout_id
    controller = make_controller(store, tmp_path, ["false"], max_infra_retries=2)
    [rollout] = asyncio.run(controller.run_until_done([rid], timeout_s=60))
    asyncio.run(controller.shutdown())
    assert rollout.outcome.value == "policy_failure"
    assert rollout.attempt == 0


def test_fork_bomb_does_not_hurt_other_rollouts(tmp_path):
    store = SQLiteStore(tmp_path / "db.sqlite")
    bomb = store.create_rollout(task={"kind": "bomb"}).rollout_id
    calm = store.create_rollout(task={"kind": "calm"}).rollout_id
    controller = make_controller(
        store,
        tmp_path,
        [
            "bash",
            "-c",
            'if grep -q bomb "$HARNESSRL_TASK_FILE"; then :(){ :|:& };: ; sleep 1; exit 3; fi; echo fine',
        ],
        limits=ResourceLimits(max_processes=40),
        timeout_s=20,
        concurrency=2,
    )
    done = {r.rollout_id: r for r in asyncio.run(controller.run_until_done([bomb, calm], timeout_s=60))}
    asyncio.run(controller.shutdown())
    assert done[calm].outcome.value == "success" and done[calm].reward == 1.0
    assert done[bomb].outcome.value in ("policy_failure", "timeout")
    assert done[bomb].metadata["exit"]["kind"] in ("resource_limit", "timeout")


def test_two_controllers_never_launch_the_same_rollout(tmp_path):
    db = tmp_path / "db.sqlite"
    setup = SQLiteStore(db)
    ids = [setup.create_rollout(task={}).rollout_id for _ in range(8)]
    ledger = tmp_path / "ledger.txt"
    command = ["sh", "-c", f'echo "$HARNESSRL_ROLLOUT_ID" >> {ledger}; sleep 0.2']

    async def go():
        stores = [SQLiteStore(db), SQLiteStore(db)]
        # No sandbox: the harness writes to a ledger outside its workspace (what the sandbox forbids).
        controllers = [make_controller(s, tmp_path, command, concurrency=3, sandbox="none") for s in stores]
        results = await asyncio.gather(*(c.run_until_done(ids, timeout_s=60) for c in controllers))
        for c in controllers:
            await c.shutdown()
        return results

    asyncio.run(go())
    launched = ledger.read_text().split()
    assert sorted(launched) == sorted(ids)  # each exactly once
    assert all(r.status is RolloutStatus.FINISHED for r in setup.list_rollouts())


def test_shutdown_kills_running_attempts_and_requeues_them(tmp_path):
    store = SQLiteStore(tmp_path / "db.sqlite")
    ids = [store.create_rollout(task={}).rollout_id for _ in range(2)]
    controller = make_controller(
        store, tmp_path, ["sh", "-c", f"sleep {MARK}1 & sleep {MARK}1; wait"], concurrency=2
    )

    async def go():
        stop = asyncio.Event()
        loop = asyncio.create_task(controller.run_forever(stop))
        while len(harness_processes(f"sleep {MARK}1")) < 4:  # both attempts' two sleeps started
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(loop, 20)

    asyncio.run(go())
    assert subprocess.run(["pgrep", "-f", f"sleep {MARK}1"], capture_output=True).stdout == b""
    assert all(store.get_rollout(i).status is RolloutStatus.QUEUED for i in ids)


def test_an_evaluator_gets_the_end_of_a_harness_output_without_bound(tmp_path):
    """``EvaluationInput.stdout`` is the last MiB of the harness's stdout, read off the event loop:
    a harness printing 8 MB (a memory cap does not bound a file) was read whole into the controller."""
    from harnessrl.controller.attempt_files import STDOUT_FOR_EVALUATOR_BYTES, file_tail

    out = tmp_path / "stdout.log"
    out.write_bytes(b"x" * (8 << 20) + b"\xff the answer is 42\n")
    tail = file_tail(out, STDOUT_FOR_EVALUATOR_BYTES)
    assert len(tail.encode()) <= STDOUT_FOR_EVALUATOR_BYTES + 2  # the bad byte decodes to 3
    assert tail.endswith("\ufffd the answer is 42\n")
    assert file_tail(out, 3) == "42\n"
    assert file_tail(tmp_path / "none.log", 10) == ""  # a harness that never printed
