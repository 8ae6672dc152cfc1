"""``Checkpointer.written``: a wait for the checkpoint being written that is cancelled (Ctrl-C or
SIGTERM while a step waits for the previous step's checkpoint before it changes the weights) leaves
the write pending, so the run's way out (``Trainer.run``'s ``finally``) waits for it again.

It used to forget the write as the wait began: the second wait returned at once while the thread
was still writing, and the run went on to close its store and exit under it.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from harnessrl.trainer.checkpoint import STATE_FILE, Checkpointer, TrainState, latest_checkpoint

#: Ends a hung test only; no correct run comes near it.
HUNG_S = 60.0


class HeldWrite:
    """A policy whose checkpoint is written only once ``release`` is set (a write that takes long)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.fail = False

    def save_checkpoint(self, folder: Path, with_optimizer: bool = True) -> None:
        self.started.set()
        if not self.release.wait(HUNG_S):
            raise TimeoutError("the test never released the write")
        if self.fail:
            raise OSError("disk full")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.safetensors").write_bytes(b"weights")


async def cancelled_wait(checkpointer: Checkpointer) -> None:
    waiter = asyncio.create_task(checkpointer.written())
    await asyncio.sleep(0)  # the wait has begun
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


def test_a_cancelled_wait_leaves_the_write_for_the_next_wait(tmp_path: Path) -> None:
    policy = HeldWrite()

    async def scenario() -> None:
        checkpointer = Checkpointer(policy, tmp_path, save_every=0, background=True)
        await checkpointer.save(TrainState(step=1))
        assert await asyncio.to_thread(policy.started.wait, HUNG_S)
        await cancelled_wait(checkpointer)
        # The run's way out waits for the checkpoint; the write ends only after this wait began.
        asyncio.get_running_loop().call_soon(policy.release.set)
        await asyncio.wait_for(checkpointer.written(), HUNG_S)
        latest = latest_checkpoint(tmp_path)
        assert latest is not None and TrainState.from_json((latest / STATE_FILE).read_text()).step == 1
        assert await checkpointer.written() == 0.0  # nothing pending any more

    asyncio.run(scenario())


def test_a_failed_write_is_raised_once_also_after_a_cancelled_wait(tmp_path: Path) -> None:
    policy = HeldWrite()
    policy.fail = True

    async def scenario() -> None:
        checkpointer = Checkpointer(policy, tmp_path, save_every=0, background=True)
        await checkpointer.save(TrainState(step=1))
        assert await asyncio.to_thread(policy.started.wait, HUNG_S)
        await cancelled_wait(checkpointer)
        policy.release.set()
        with pytest.raises(OSError, match="disk full"):
            await asyncio.wait_for(checkpointer.written(), HUNG_S)
        assert await checkpointer.written() == 0.0
        assert latest_checkpoint(tmp_path) is None

    asyncio.run(scenario())


def test_control_a_wait_that_is_not_cancelled_returns_once_the_checkpoint_is_whole(tmp_path: Path) -> None:
    policy = HeldWrite()

    async def scenario() -> None:
        checkpointer = Checkpointer(policy, tmp_path, save_every=0, background=True)
        await checkpointer.save(TrainState(step=3))
        assert await asyncio.to_thread(policy.started.wait, HUNG_S)
        asyncio.get_running_loop().call_soon(policy.release.set)
        await asyncio.wait_for(checkpointer.written(), HUNG_S)
        latest = latest_checkpoint(tmp_path)
        assert latest is not None and TrainState.from_json((latest / STATE_FILE).read_text()).step == 3

    asyncio.run(scenario())
