"""What a request repeats of its rollout's previous one: the leading items of its history list that
are the same JSON, found by comparing bytes.

An agent sends its whole history on every call, so the per-call checks that walk a request (strict
JSON bounds, the prompt-size cap, pydantic validation, keying the messages for reuse) cost
O(context) per call and O(calls x context) per rollout. The items a request repeats exactly were
checked when the previous request was: only the new ones need it.

How "exactly" is decided. The history list is encoded once with orjson (compact, deterministic,
types kept apart: ``1``, ``1.0`` and ``true`` differ), and its bytes are compared with the previous
request's: the first ``k`` items are the same JSON exactly when the first ``ends[k-1]`` bytes are
equal (the ``k``-th item closes at the same byte in both, as both are the same text up to there).
One ``orjson.dumps`` of the list and a few ``memcmp``\\ s replace a digest per item.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class HistoryBytes:
    """A history list as compact JSON, and where each of its items ends in it."""

    blob: bytes  # orjson.dumps(items)
    ends: tuple[int, ...]  # ends[i]: the offset just past item i's JSON in ``blob``
    chars: tuple[int, ...]  # chars[i]: characters of text (``text_chars``) in items[: i + 1]

    def text_chars(self, count: int) -> int:
        """Characters of text in the first ``count`` items."""
        return self.chars[count - 1] if count else 0

    def texts(self) -> tuple[str, ...]:
        """Each item's compact JSON, as ``orjson.dumps`` of the item gives it (the store keeps these)."""
        blob, ends = self.blob, self.ends
        starts = (1, *(end + 1 for end in ends[:-1]))
        text = blob.decode()
        if len(text) == len(blob):  # ASCII: byte offsets are character offsets
            return tuple(map(text.__getitem__, map(slice, starts, ends)))
        return tuple(blob[start:end].decode() for start, end in zip(starts, ends, strict=True))


def text_chars(node: Any) -> int:
    """Characters of every string value in a JSON value (object keys excluded), without recursion."""
    total = 0
    stack = [node]
    while stack:
        node = stack.pop()
        if type(node) is str:
            total += len(node)
        elif type(node) is dict:
            stack.extend(node.values())
        elif type(node) is list:
            stack.extend(node)
    return total


def history_bytes(items: Sequence[Any], previous: HistoryBytes | None) -> tuple[HistoryBytes, int] | None:
    """``items`` as ``HistoryBytes`` and how many leading items are the same JSON as ``previous``'s;
    ``None`` when orjson cannot encode them (deeper than it nests, integers past 64 bits): the
    caller then checks the whole request, as without a previous one."""
    try:
        blob = orjson.dumps(items if isinstance(items, list) else list(items))
    except TypeError:
        return None
    same = 0 if previous is None else _same_items(blob, previous)
    ends = list(previous.ends[:same]) if previous is not None else []
    chars = list(previous.chars[:same]) if previous is not None else []
    position = ends[-1] + 1 if ends else 1  # past the separator (or the list's "[")
    counted = chars[-1] if chars else 0
    for item in items[same:]:
        position += len(orjson.dumps(item))  # the same bytes as inside the list: orjson is deterministic
        counted += text_chars(item)
        ends.append(position)
        chars.append(counted)
        position += 1
    return HistoryBytes(blob, tuple(ends), tuple(chars)), same


def _same_items(blob: bytes, previous: HistoryBytes) -> int:
    """How many leading items of ``previous`` the list encoded in ``blob`` starts with."""

    def shares(k: int) -> bool:  # the first k items are the same JSON
        end = previous.ends[k - 1]
        return blob[end : end + 1] in (b",", b"]") and blob.startswith(previous.blob[:end])

    ends = previous.ends
    if not ends:
        return 0
    if shares(len(ends)):
        return len(ends)  # the usual call: every earlier item repeated, new ones appended
    lo, hi = 0, len(ends) - 1  # shares(lo) holds (0 trivially); shares(hi + 1) does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if shares(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
