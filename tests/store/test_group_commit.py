"""``SQLStore.add_calls``: several calls in one transaction (the gateway's group commit), each
failing alone. Run against every SQL backend in ``conftest.BACKENDS``."""

from __future__ import annotations

import pytest
from tests.store.calls import make_call

from harnessrl.errors import BadRequest, NotFound
from harnessrl.store import Store
from harnessrl.store.codecs import pack_ints, unpack_ints


def test_add_calls_numbers_each_rollout_in_list_order(store: Store) -> None:
    a, b = store.create_rollout(), store.create_rollout()
    store.add_call(make_call(a.rollout_id))
    calls = [
        make_call(a.rollout_id),
        make_call(b.rollout_id),
        make_call(a.rollout_id, finish_reason="length"),
    ]
    results = store.add_calls(calls)
    assert [(r.rollout_id, r.seq) for r in results] == [
        (a.rollout_id, 1),
        (b.rollout_id, 0),
        (a.rollout_id, 2),
    ]
    assert all(r.call_id for r in results)
    assert store.list_calls(a.rollout_id)[1:] == [results[0], results[2]]
    assert store.list_calls(b.rollout_id) == [results[1]]


def test_add_calls_a_bad_call_fails_alone(store: Store) -> None:
    rollout = store.create_rollout()
    calls = [
        make_call(rollout.rollout_id),
        make_call("no-such-rollout"),
        make_call(rollout.rollout_id, prompt_token_ids=[2**31]),  # fails while encoding
        make_call(rollout.rollout_id),
    ]
    results = store.add_calls(calls)
    assert isinstance(results[1], NotFound) and isinstance(results[2], BadRequest)
    assert [r.seq for r in (results[0], results[3])] == [0, 1]  # type: ignore[union-attr]
    assert [c.seq for c in store.list_calls(rollout.rollout_id)] == [0, 1]
    assert store.count_calls() == 2


def test_pack_ints_is_little_endian_int32_and_rejects_non_integers() -> None:
    assert pack_ints([1, -2]) == b"\x01\x00\x00\x00\xfe\xff\xff\xff"
    assert unpack_ints(pack_ints([0, 2**31 - 1, -(2**31)])) == [0, 2**31 - 1, -(2**31)]
    with pytest.raises(BadRequest, match="int32"):
        pack_ints([2**31])
    with pytest.raises(TypeError, match="integers"):
        pack_ints([1.5])  # type: ignore[list-item]


def test_batches_naming_rollouts_in_opposite_orders_do_not_deadlock(store: Store) -> None:
    """Two writers (two gateways on one PostgreSQL) whose batches hold the same rollouts in opposite
    orders: rows are locked in rollout-id order, so neither waits on the other's lock forever."""
    import threading

    a, b = store.create_rollout(), store.create_rollout()
    errors: list[BaseException] = []
    rounds = 25

    def writer(order: list[str]) -> None:
        try:
            for _ in range(rounds):
                for result in store.add_calls([make_call(rid) for rid in order]):
                    if isinstance(result, BaseException):
                        raise result
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=writer, args=([a.rollout_id, b.rollout_id],)),
        threading.Thread(target=writer, args=([b.rollout_id, a.rollout_id],)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[0]
    for rollout in (a, b):
        assert [c.seq for c in store.list_calls(rollout.rollout_id)] == list(range(2 * rounds))
