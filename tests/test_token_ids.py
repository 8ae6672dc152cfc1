"""``TokenIds`` keeps encodings that are always those of the IDs it holds.

Its encodings are the ones sent to engines and written to the store, so a stale one would make a
call condition on (or record) other tokens than its prompt: every way of building or changing a
``TokenIds`` is checked against encoding its IDs from scratch.
"""

from __future__ import annotations

import copy
import gc
import pickle
import struct
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harnessrl.token_ids import KeptIds, TokenIds, common_prefix, int32_bytes, json_array

ids = st.lists(st.integers(min_value=-(2**31), max_value=2**31 - 1), max_size=40)


def encoded_from_scratch(values: list[int]) -> tuple[bytes, bytes]:
    return struct.pack(f"<{len(values)}i", *values), orjson.dumps(values)


def encodings(t: TokenIds) -> tuple[bytes, bytes]:
    return t.packed(), t.json()


@settings(max_examples=200, deadline=None)
@given(first=ids, rest=st.lists(ids, max_size=4), encode_first=st.booleans())
def test_joined_encodings_are_those_of_the_concatenation(
    first: list[int], rest: list[list[int]], encode_first: bool
) -> None:
    base = TokenIds(first)
    if encode_first:
        encodings(base)  # kept: the join extends them
    parts: list[Any] = [base, *[TokenIds(p) if i % 2 else p for i, p in enumerate(rest)]]
    joined = TokenIds.joined(*parts)
    whole = [v for part in parts for v in part]
    assert joined == whole
    assert encodings(joined) == encoded_from_scratch(whole)
    assert (int32_bytes(joined), json_array(joined)) == encoded_from_scratch(whole)
    assert (int32_bytes(whole), json_array(whole)) == encoded_from_scratch(whole)


MUTATIONS = [
    ("append", lambda t: t.append(7)),
    ("extend", lambda t: t.extend([1, 2])),
    ("insert", lambda t: t.insert(0, 9)),
    ("pop", lambda t: t.pop()),
    ("remove", lambda t: t.remove(t[0])),
    ("clear", lambda t: t.clear()),
    ("sort", lambda t: t.sort()),
    ("reverse", lambda t: t.reverse()),
    ("setitem", lambda t: t.__setitem__(0, 42)),
    ("setslice", lambda t: t.__setitem__(slice(0, 2), [5])),
    ("delitem", lambda t: t.__delitem__(0)),
    ("iadd", lambda t: t.__iadd__([3])),
    ("imul", lambda t: t.__imul__(2)),
]


@pytest.mark.parametrize("mutate", [m for _, m in MUTATIONS], ids=[n for n, _ in MUTATIONS])
def test_every_change_drops_the_kept_encodings(mutate: Any) -> None:
    t = TokenIds([3, 1, 2])
    before = encodings(t)
    mutate(t)
    assert encodings(t) == encoded_from_scratch(list(t))
    assert encodings(t) != before  # control: each of these changes the IDs, so stale ones would differ


def test_a_join_on_a_changed_base_uses_the_new_ids() -> None:
    base = TokenIds([1, 2, 3])
    encodings(base)
    base.append(4)
    assert encodings(TokenIds.joined(base, [5])) == encoded_from_scratch([1, 2, 3, 4, 5])


def test_it_is_a_list_and_copies_without_encodings() -> None:
    t = TokenIds([1, 2, 3])
    encodings(t)
    assert t == [1, 2, 3] and t == [1, 2, 3] and isinstance(t, list)
    assert orjson.dumps(t) == b"[1,2,3]"
    for other in (copy.copy(t), copy.deepcopy(t), pickle.loads(pickle.dumps(t))):
        assert type(other) is TokenIds and other == t
        other.append(4)
        assert encodings(other) == encoded_from_scratch([1, 2, 3, 4]) and encodings(
            t
        ) == encoded_from_scratch([1, 2, 3])


def test_a_value_past_int32_is_refused_when_packed() -> None:
    with pytest.raises(struct.error):
        TokenIds([2**31]).packed()


@settings(max_examples=100, deadline=None)
@given(first=ids, rest=st.lists(ids, max_size=3), encode_first=st.booleans())
def test_joined_on_kept_ids_encodes_the_concatenation(
    first: list[int], rest: list[list[int]], encode_first: bool
) -> None:
    base = TokenIds(first)
    if encode_first:
        encodings(base)
    kept = KeptIds(base)
    assert kept.ids == tuple(first) and (kept.packed is not None) == encode_first
    joined = TokenIds.joined(kept, *rest)
    whole = [*first, *(v for part in rest for v in part)]
    assert joined == whole and encodings(joined) == encoded_from_scratch(whole)
    kept.forget_encodings()
    assert encodings(TokenIds.joined(kept, *rest)) == encoded_from_scratch(whole)


def test_kept_ids_are_left_alone_by_the_garbage_collector() -> None:
    """A gateway keeps every answered call's prompt (16 k IDs) for the next: as a list the collector
    would walk every one of them on each full collection; an exact tuple of ints it stops tracking."""
    kept = KeptIds(TokenIds(range(1000, 17000)))
    gc.collect()
    assert not gc.is_tracked(kept.ids)
    assert gc.is_tracked(TokenIds(range(1000, 17000)))  # the control: a list stays tracked


def test_kept_ids_hold_only_what_they_add_to_what_they_were_joined_on() -> None:
    """A rollout's remembered prompts are deltas: memory O(its tokens), not O(calls x context)."""
    first = KeptIds(TokenIds(range(1000)))
    second = KeptIds(TokenIds.joined(first, [1, 2], [3]))
    third = KeptIds(TokenIds.joined(second, [4]))
    assert (second.base, second.extra) == (first, (1, 2, 3)) and (third.base, third.extra) == (second, (4,))
    assert third.ids == (*range(1000), 1, 2, 3, 4) and len(third) == 1004
    assert TokenIds.joined(third, [5]) == [*range(1000), 1, 2, 3, 4, 5]
    changed = TokenIds.joined(second, [4])
    changed[0] = -1  # no longer what it was joined on: kept whole
    kept = KeptIds(changed)
    assert kept.base is None and kept.ids == (-1, *range(1, 1000), 1, 2, 3, 4)


@given(
    st.lists(st.integers(0, 3), max_size=40),
    st.lists(st.integers(0, 3), max_size=40),
    st.none() | st.integers(0, 50),
    st.sampled_from([list, tuple, TokenIds]),
)
def test_common_prefix_is_the_shared_start(a, b, limit, kind):
    naive = 0
    while naive < min(len(a), len(b)) and a[naive] == b[naive]:
        naive += 1
    expected = naive if limit is None else min(naive, limit)
    assert common_prefix(kind(a), b, limit) == expected
    assert common_prefix(a + [9] * 100, a + [8], None) == len(a)  # they differ right after ``a``
