"""``SharedKeyCounts``: the per-key counts ``--workers`` processes share (``gateway.key_limits``).

Real forked processes; the end-to-end cap across a real ``--workers 2`` gateway is in
``test_workers``. Here the table itself: counts one process takes are seen by another, a slot freed
by one key is reused by another without losing a key further along, and ``LocalKeyCounts`` agrees
with it on every sequence of takes and give-backs.
"""

from __future__ import annotations

import multiprocessing

from hypothesis import given, settings
from hypothesis import strategies as st

from harnessrl.gateway.key_limits import LocalKeyCounts, SharedKeyCounts


def _take_in_child(counts: SharedKeyCounts, key: bytes, limit: int, done: multiprocessing.Queue) -> None:
    done.put(counts.take(key, limit))


def test_a_count_taken_in_one_process_is_seen_in_another() -> None:
    counts = SharedKeyCounts()
    ctx = multiprocessing.get_context("fork")
    answers: multiprocessing.Queue = ctx.Queue()
    child = ctx.Process(target=_take_in_child, args=(counts, b"key-a", 1, answers))
    child.start()
    child.join(timeout=60)
    assert answers.get(timeout=60) is None  # taken there
    assert counts.take(b"key-a", 1) == 1  # refused here: one in flight (in the child's name)
    assert counts.take(b"key-b", 1) is None  # another key is not
    counts.give_back(b"key-a")
    assert counts.take(b"key-a", 1) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 40)), max_size=200))
def test_shared_counts_agree_with_local_counts(ops: list[tuple[bool, int]]) -> None:
    """Takes and give-backs over keys that crowd a small table (slots freed and reused by other
    keys): the shared counts answer as the plain dict does."""

    class Small(SharedKeyCounts):
        SLOTS = 64  # 41 keys in 64 slots: long probe runs and reused slots

    shared, local = Small(), LocalKeyCounts()
    held: dict[bytes, int] = {}
    for take, k in ops:
        key = f"hrl-{k}".encode()
        if take:
            answer = shared.take(key, 3)
            assert answer == local.take(key, 3)
            if answer is None:
                held[key] = held.get(key, 0) + 1
        elif held.get(key):
            shared.give_back(key)
            local.give_back(key)
            held[key] -= 1


def _die_holding(counts: SharedKeyCounts) -> None:
    counts._lock.acquire()  # and exit without releasing: a worker killed inside the critical section


def test_a_lock_left_held_by_a_dead_worker_is_given_up_once_and_counts_go_on_per_process() -> None:
    class Quick(SharedKeyCounts):
        LOCK_TIMEOUT_S = 0.05

    counts = Quick()
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_die_holding, args=(counts,))
    child.start()
    child.join(timeout=60)
    assert not counts._lock.acquire(timeout=0.01)  # control: the lock really is held for good
    tries = 0
    real_acquire = counts._lock.acquire

    def counted_acquire(*args: object, **kwargs: object) -> bool:
        nonlocal tries
        tries += 1
        return real_acquire(*args, **kwargs)  # type: ignore[arg-type]

    counts._lock = type("Counted", (), {"acquire": staticmethod(counted_acquire)})()  # type: ignore[assignment]
    assert counts.take(b"key-a", 1) is None  # waited once, then counted here
    assert counts.take(b"key-a", 1) == 1  # the cap still holds, on this process's own counts
    counts.give_back(b"key-a")
    assert counts.take(b"key-a", 1) is None
    assert tries == 1  # the stuck lock was waited on once, not on every request
