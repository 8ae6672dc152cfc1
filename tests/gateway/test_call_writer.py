"""The gateway's group commit (``gateway.writer.CallWriter``) and its GC settings (``tune_gc``).

Calls are batched deterministically by holding the database's write lock from a second SQLite
connection (as another process would): the first call's transaction waits for it, and every call
added meanwhile goes into the next transaction together.
"""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from harnessrl.errors import NotFound
from harnessrl.gateway.process import GC_GEN0_THRESHOLD, tune_gc
from harnessrl.gateway.writer import CallWriter
from harnessrl.schemas import Call
from harnessrl.store.sqlite import SQLiteStore


def make_call(rollout_id: str, **fields: Any) -> Call:
    return Call(
        rollout_id=rollout_id,
        prompt_token_ids=[1, 2],
        response_token_ids=[3],
        response_logprobs=[-0.5],
        **fields,
    )


class DatabaseLock:
    """Holds SQLite's write lock from another connection until ``release``."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        self.conn.execute("COMMIT")
        self.conn.close()


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = SQLiteStore(tmp_path / "s.db")
    yield s
    s.close()


async def until(condition: Any, timeout_s: float = 10.0) -> None:
    """Yield to the event loop until ``condition()`` holds (the writer's thread moves meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the writer never got there"
        await asyncio.sleep(0.005)


def test_concurrent_calls_share_one_commit_and_each_is_durable_when_answered(
    store: SQLiteStore, tmp_path: Path
) -> None:
    rollout = store.create_rollout()
    writer = CallWriter(store)
    seen: dict[int, list[int]] = {}

    async def add(tag: int) -> int:
        stored = await writer.add(make_call(rollout.rollout_id, finish_reason=f"r{tag}"))
        # Durable by the time the caller may answer: a fresh connection sees it.
        other = SQLiteStore(tmp_path / "s.db")
        try:
            seen[tag] = [c.seq for c in other.list_calls(rollout.rollout_id)]
        finally:
            other.close()
        return stored.seq

    async def main() -> list[int]:
        lock = DatabaseLock(tmp_path / "s.db")
        first = asyncio.ensure_future(add(0))
        await until(lambda: writer.writing and writer.queued == 0)  # waiting for the lock with call 0
        rest = [asyncio.ensure_future(add(i)) for i in (1, 2, 3)]
        await until(lambda: writer.queued == 3)
        lock.release()
        return await asyncio.gather(first, *rest)

    seqs = asyncio.run(main())
    writer.close()
    assert seqs == [0, 1, 2, 3]  # queue order is seq order
    assert writer.batches == 2  # call 0 alone, then 1-3 in one transaction
    assert [c.finish_reason for c in store.list_calls(rollout.rollout_id)] == ["r0", "r1", "r2", "r3"]
    for tag in range(4):
        assert tag in seen[tag]


def test_a_failed_write_fails_only_its_own_call(store: SQLiteStore, tmp_path: Path) -> None:
    rollout = store.create_rollout()
    writer = CallWriter(store)

    async def main() -> list[Any]:
        lock = DatabaseLock(tmp_path / "s.db")
        blocker = asyncio.ensure_future(writer.add(make_call(rollout.rollout_id)))
        await until(lambda: writer.writing and writer.queued == 0)
        batch = [
            asyncio.ensure_future(writer.add(make_call(rollout.rollout_id))),
            asyncio.ensure_future(writer.add(make_call("no-such-rollout"))),
            asyncio.ensure_future(writer.add(make_call(rollout.rollout_id))),
        ]
        await until(lambda: writer.queued == 3)
        lock.release()
        return await asyncio.gather(blocker, *batch, return_exceptions=True)

    results = asyncio.run(main())
    writer.close()
    assert writer.batches == 2
    assert isinstance(results[2], NotFound)
    assert [r.seq for r in (results[0], results[1], results[3])] == [0, 1, 2]
    assert store.count_calls() == 3


def test_writer_serves_several_event_loops_and_restarts_after_close(store: SQLiteStore) -> None:
    rollout = store.create_rollout()
    writer = CallWriter(store)
    out: list[int] = []

    def in_own_loop() -> None:
        out.append(asyncio.run(writer.add(make_call(rollout.rollout_id))).seq)

    threads = [threading.Thread(target=in_own_loop) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(out) == [0, 1, 2, 3]
    writer.close()
    assert asyncio.run(writer.add(make_call(rollout.rollout_id))).seq == 4  # a new thread after close
    writer.close()


def test_a_lone_call_is_written_at_once_and_a_held_lock_sends_it_to_the_thread(
    store: SQLiteStore, tmp_path: Path
) -> None:
    rollout = store.create_rollout()
    writer = CallWriter(store)

    async def main() -> list[int]:
        alone = [(await writer.add(make_call(rollout.rollout_id))).seq for _ in range(3)]
        lock = DatabaseLock(tmp_path / "s.db")
        held = asyncio.ensure_future(writer.add(make_call(rollout.rollout_id)))
        await until(lambda: writer.writing and writer.queued == 0)
        assert not held.done()  # in the thread, waiting for the lock (not the event loop)
        lock.release()
        return [*alone, (await held).seq]

    assert asyncio.run(main()) == [0, 1, 2, 3]
    writer.close()
    assert (writer.written_at_once, writer.batches) == (3, 1)
    assert store.count_calls(rollout.rollout_id) == 4


def test_tune_gc_freezes_startup_objects_and_raises_the_young_threshold() -> None:
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == (GC_GEN0_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() > 0
        garbage: list[Any] = []
        garbage.append(garbage)  # a cycle: still collected
        del garbage
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
        time.sleep(0)
