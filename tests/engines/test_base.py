"""``engines.base.through_first_stop`` cuts an answer where the plain scan does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from harnessrl.engines.base import through_first_stop


@given(ids=st.lists(st.integers(0, 9), max_size=30), stops=st.sets(st.integers(0, 9), max_size=3))
def test_the_cut_is_after_the_first_stop_token(ids: list[int], stops: set[int]) -> None:
    plain = next((i + 1 for i, t in enumerate(ids) if t in stops), len(ids))
    assert through_first_stop(ids, stops) == through_first_stop(tuple(ids), list(stops)) == plain
