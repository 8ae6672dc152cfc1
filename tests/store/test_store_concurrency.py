"""The ``Store`` contract under concurrency: claims and seq assignment from several threads and
processes, and durability when a writer process is SIGKILLed. Runs against every backend; the
cross-process tests only where a second connection sees the same data.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from harnessrl.schemas import Call

WORKER = Path(__file__).with_name("store_worker.py")
T = TypeVar("T")


def _load_worker_module() -> Any:
    # Loaded by path so the test does not depend on pytest's sys.path handling.
    spec = importlib.util.spec_from_file_location("store_worker", WORKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


call_for = _load_worker_module().call_for


def run_in_threads(n: int, target: Callable[[int], T]) -> list[T]:
    """Run ``target(i)`` in n threads released together; re-raise the first failure."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait()
            results[i] = target(i)
        except BaseException as exc:  # collected and re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if errors:
        raise errors[0]
    return results


def start_workers(args: Sequence[Sequence[str]]) -> list[subprocess.Popen[str]]:
    """Start worker processes, wait until each has opened the store, then release them together."""
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), *a], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for a in args
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    return procs


def finish_workers(procs: list[subprocess.Popen[str]]) -> list[list[str]]:
    outputs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        outputs.append(out.split())
    return outputs


# -- claims ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("connections", ["one", "per-thread"])
def test_threads_never_claim_the_same_rollout(store_factory: Any, connections: str) -> None:
    if connections == "per-thread" and not store_factory.shared:
        pytest.skip("this backend's data is private to one connection")
    store = store_factory()
    made = {store.create_rollout().rollout_id for _ in range(120)}
    stores = [store if connections == "one" else store_factory() for _ in range(4)]

    def claim_all(i: int) -> list[str]:
        mine = []
        while claimed := stores[i].claim_rollouts(f"w{i}", 1 + i % 3):
            mine += [r.rollout_id for r in claimed]
        return mine

    per_worker = run_in_threads(4, claim_all)
    claimed = [rid for ids in per_worker for rid in ids]
    assert len(claimed) == len(set(claimed)) and set(claimed) == made
    for i, ids in enumerate(per_worker):
        assert all(store.get_rollout(rid).worker_id == f"w{i}" for rid in ids)


def test_processes_never_claim_the_same_rollout(shared_store_factory: Any) -> None:
    store = shared_store_factory()
    made = {store.create_rollout().rollout_id for _ in range(300)}
    url = shared_store_factory.url
    outputs = finish_workers(start_workers([["claim", url, f"p{i}"] for i in range(3)]))
    claimed = [rid for ids in outputs for rid in ids]
    assert len(claimed) == len(set(claimed)), "a rollout was claimed twice"
    assert set(claimed) == made
    for i, ids in enumerate(outputs):
        assert all(store.get_rollout(rid).worker_id == f"p{i}" for rid in ids)


# -- seq assignment -------------------------------------------------------------------------------


def test_concurrent_add_call_from_threads(store_factory: Any) -> None:
    store = store_factory()
    stores = [store, *(store_factory() for _ in range(2))] if store_factory.shared else [store] * 3
    rollout = store.create_rollout()

    def add_calls(i: int) -> list[Call]:
        return [
            stores[i % 3].add_call(
                Call(
                    rollout_id=rollout.rollout_id,
                    request={"thread": i, "n": n},
                    prompt_token_ids=[i, n],
                    response_token_ids=[n],
                    response_logprobs=[-float(n)],
                )
            )
            for n in range(25)
        ]

    per_thread = run_in_threads(6, add_calls)
    listed = store.list_calls(rollout.rollout_id)
    assert [c.seq for c in listed] == list(range(150))
    assert sorted(c.call_id for c in listed) == sorted(c.call_id for calls in per_thread for c in calls)
    by_id = {c.call_id: c for c in listed}
    for calls in per_thread:
        seqs = [c.seq for c in calls]
        assert seqs == sorted(seqs)  # one writer's calls keep its order
        assert all(by_id[c.call_id] == c for c in calls)


def test_concurrent_add_call_from_processes(shared_store_factory: Any) -> None:
    store = shared_store_factory()
    rollout = store.create_rollout()
    url = shared_store_factory.url
    procs = start_workers([["calls", url, rollout.rollout_id, "40"] for _ in range(3)])
    outputs = finish_workers(procs)
    listed = store.list_calls(rollout.rollout_id)
    assert [c.seq for c in listed] == list(range(120))
    writers = collections.Counter(c.request["messages"][0]["content"].split(":")[0] for c in listed)
    assert writers == {str(proc.pid): 40 for proc in procs}
    for proc, seqs in zip(procs, outputs, strict=True):
        mine = [c.seq for c in listed if c.request["messages"][0]["content"].startswith(f"{proc.pid}:")]
        assert mine == [int(s) for s in seqs]


def test_a_finish_racing_writers_leaves_only_calls_recorded_before_it(store_factory: Any) -> None:
    """Writers keep adding calls while another connection reads the calls and finishes: every call
    is either in what a read right after the finish sees, or was refused; none lands after it."""
    from harnessrl.schemas import Outcome
    from harnessrl.store.base import RolloutEnded

    store = store_factory()
    stores = [store_factory() for _ in range(3)] if store_factory.shared else [store] * 3
    rollout = store.start_rollout(store.create_rollout().rollout_id)
    started = threading.Event()
    outcome: dict[int, tuple[list[Call], int]] = {}

    def write(i: int) -> None:
        # Until the finish has refused this writer a few times (a fixed number of writes could all
        # land before a main thread the machine's load delays finishes: no race, nothing tested).
        written, refused = [], 0
        for n in range(100_000):
            try:
                written.append(stores[i].add_call(call_for(rollout.rollout_id, n, f"{i}:")))
            except RolloutEnded:
                refused += 1
                if refused == 3:
                    break
            if n == 5:
                started.set()
        outcome[i] = (written, refused)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    assert started.wait(30)
    store.finish_rollout(rollout.rollout_id, Outcome.SUCCESS, 1.0)
    seen_at_finish = store.list_calls(rollout.rollout_id)
    for t in threads:
        t.join(timeout=60)
    written = [c for calls, _ in outcome.values() for c in calls]
    refused = sum(r for _, r in outcome.values())
    assert refused > 0 and written  # the race happened: both sides of it
    assert store.list_calls(rollout.rollout_id) == seen_at_finish  # nothing after the finish
    assert sorted(c.call_id for c in seen_at_finish) == sorted(c.call_id for c in written)


# -- durability -----------------------------------------------------------------------------------


def test_calls_survive_sigkill_of_the_writer(shared_store_factory: Any) -> None:
    store = shared_store_factory()
    rollout = store.create_rollout()
    [proc] = start_workers([["calls", shared_store_factory.url, rollout.rollout_id, "-1"]])
    assert proc.stdout is not None
    acknowledged = [int(proc.stdout.readline()) for _ in range(60)]
    os.kill(proc.pid, signal.SIGKILL)  # mid-stream: the worker is inside its next add_call
    proc.wait(timeout=30)
    proc.communicate()  # close the pipes
    assert acknowledged == list(range(60))

    reopened = shared_store_factory()
    listed = reopened.list_calls(rollout.rollout_id)
    assert [c.seq for c in listed] == list(range(len(listed)))  # no gaps, no torn rows
    assert len(listed) >= len(acknowledged)  # everything add_call returned for is there
    for call in listed:
        expected = call_for(rollout.rollout_id, call.seq, tag=f"{proc.pid}:")
        fields = ("request", "response", "prompt_token_ids", "response_token_ids", "response_logprobs")
        assert {f: getattr(call, f) for f in fields} == {f: getattr(expected, f) for f in fields}
    assert reopened.add_call(call_for(rollout.rollout_id, 0)).seq == len(listed)
