"""``TokenIds``: a list of token IDs that keeps the two encodings every model call needs of its prompt.

Each call sends its whole prompt to the engine as a JSON array and the store keeps it as int32
bytes, though all but the last few hundred of its tokens are the previous call's prompt and answer.
Encoding 16 k IDs costs ~0.15 ms each way (``orjson.dumps``, ``struct.pack``): together a large
share of the gateway's CPU per call. A ``TokenIds`` keeps each encoding once it is made, and one
built from earlier ones (``TokenIds.joined``) makes its encodings from theirs plus its new tokens',
so a call encodes only what it adds.

It is a ``list`` (equal to one, usable wherever one is), and every method that changes it drops the
kept encodings first, so they can never describe other IDs than the list holds.

IDs kept for long (the gateway remembers every answered call of a rollout for the next prompts)
are a ``KeptIds``: the ``KeptIds`` they extend, then their own new IDs as an exact tuple. Kept
whole, a rollout of n calls over a growing context held O(n x context) IDs (a 50-call, 20 k-token
rollout: 8 MB; the gateway keeps thousands of rollouts), and lists of them made every full garbage
collection walk hundreds of millions of references. As deltas a rollout holds about its final
prompt, and each tuple, holding only integers, is one the collector stops tracking.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any, SupportsIndex

import orjson

_LITTLE_ENDIAN_INT32 = "<{}i"


def int32_bytes(ids: Sequence[int]) -> bytes:
    """``ids`` as little-endian int32 bytes; ``struct.error`` for a value that is not an int32."""
    if isinstance(ids, TokenIds):
        return ids.packed()
    return _pack(ids)


def json_array(ids: Sequence[int]) -> bytes:
    """``ids`` as a compact JSON array (what ``orjson.dumps(list(ids))`` gives)."""
    if isinstance(ids, TokenIds):
        return ids.json()
    return _dump(ids)


def _pack(ids: Sequence[int]) -> bytes:
    return struct.pack(_LITTLE_ENDIAN_INT32.format(len(ids)), *ids)


def _dump(ids: Sequence[int]) -> bytes:
    return orjson.dumps(ids if isinstance(ids, list) else list(ids))  # orjson takes a list subclass as is


class KeptIds:
    """IDs kept for long: those of ``base`` (an earlier ``KeptIds``, or none), then ``extra`` (an exact
    tuple), with the encodings a ``TokenIds`` had made of them (``TokenIds.joined`` extends them).

    Made from a ``TokenIds`` joined on a ``KeptIds`` and not changed since, it keeps only the IDs
    after that base; from anything else, all of them.
    """

    __slots__ = ("base", "extra", "json", "length", "packed")

    def __init__(self, ids: Sequence[int]) -> None:
        base = ids._base if isinstance(ids, TokenIds) else None
        self.base: KeptIds | None = base
        self.extra: tuple[int, ...] = tuple(ids[len(base) :] if base is not None else ids)
        self.length = len(ids)
        self.packed: bytes | None = ids._packed if isinstance(ids, TokenIds) else None
        self.json: bytes | None = ids._json if isinstance(ids, TokenIds) else None

    def __len__(self) -> int:
        return self.length

    def pieces(self) -> list[tuple[int, ...]]:
        """The tuples whose concatenation is these IDs, first to last."""
        out = []
        node: KeptIds | None = self
        while node is not None:
            out.append(node.extra)
            node = node.base
        out.reverse()
        return out

    @property
    def ids(self) -> tuple[int, ...]:
        """All the IDs, as one tuple (made on each access: for the slow paths)."""
        pieces = self.pieces()
        return pieces[0] if len(pieces) == 1 else tuple(v for piece in pieces for v in piece)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeptIds) and len(self) == len(other) and self.ids == other.ids

    __hash__ = None  # type: ignore[assignment]

    def forget_encodings(self) -> None:
        """Drop the kept encodings (memory): a ``TokenIds`` joined on these IDs makes them again."""
        self.packed = self.json = None


def _join_arrays(arrays: Iterable[bytes]) -> bytes:
    inner = [a[1:-1] for a in arrays if len(a) > 2]
    return b"[" + b",".join(inner) + b"]"


class TokenIds(list[int]):
    """Token IDs with their int32 bytes (``packed``) and JSON array (``json``) kept once computed."""

    __slots__ = ("_base", "_json", "_packed")

    def __init__(self, ids: Iterable[int] = ()) -> None:
        super().__init__(ids)
        self._packed: bytes | None = None
        self._json: bytes | None = None
        self._base: KeptIds | None = None  # what ``joined`` started this from, while it is unchanged

    @classmethod
    def joined(cls, first: Sequence[int] | KeptIds, *parts: Sequence[int]) -> TokenIds:
        """The concatenation of ``first`` and ``parts``. Each encoding ``first`` already has (a
        ``TokenIds``'s or a ``KeptIds``'s) is extended with the others' (encoded now: they are the
        short new tokens), not made again from the whole."""
        out = cls()
        if isinstance(first, KeptIds):
            for piece in first.pieces():
                list.extend(out, piece)
            packed, json, out._base = first.packed, first.json, first
        else:
            list.extend(out, first)
            packed, json = (first._packed, first._json) if isinstance(first, TokenIds) else (None, None)
        for part in parts:
            list.extend(out, part)
        if packed is not None:
            out._packed = b"".join([packed, *map(int32_bytes, parts)])
        if json is not None:
            out._json = _join_arrays([json, *map(json_array, parts)])
        return out

    def packed(self) -> bytes:
        """Little-endian int32 bytes (``struct.error`` if a value does not fit); kept."""
        if self._packed is None:
            self._packed = _pack(self)
        return self._packed

    def json(self) -> bytes:
        """The compact JSON array; kept."""
        if self._json is None:
            self._json = _dump(self)
        return self._json

    def forget_encodings(self) -> None:
        """Drop the kept encodings (memory): they are made again if asked for."""
        self._packed = self._json = None

    # -- every change drops the encodings -------------------------------------------------------------

    def _changed(self) -> None:
        self._packed = self._json = self._base = None

    def append(self, value: int, /) -> None:
        self._changed()
        super().append(value)

    def extend(self, values: Iterable[int], /) -> None:
        self._changed()
        super().extend(values)

    def insert(self, index: SupportsIndex, value: int, /) -> None:
        self._changed()
        super().insert(index, value)

    def pop(self, index: SupportsIndex = -1, /) -> int:
        self._changed()
        return super().pop(index)

    def remove(self, value: int, /) -> None:
        self._changed()
        super().remove(value)

    def clear(self) -> None:
        self._changed()
        super().clear()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        self._changed()
        super().sort(*args, **kwargs)

    def reverse(self) -> None:
        self._changed()
        super().reverse()

    def __setitem__(self, index: Any, value: Any) -> None:
        self._changed()
        super().__setitem__(index, value)

    def __delitem__(self, index: Any) -> None:
        self._changed()
        super().__delitem__(index)

    def __iadd__(self, values: Iterable[int]) -> TokenIds:  # type: ignore[override,misc]
        self._changed()
        return super().__iadd__(values)  # type: ignore[return-value]

    def __imul__(self, times: SupportsIndex) -> TokenIds:  # type: ignore[override,misc]
        self._changed()
        return super().__imul__(times)  # type: ignore[return-value]

    def __reduce__(self) -> tuple[Any, ...]:
        return (TokenIds, (list(self),))  # a copy or pickle carries the IDs, not the encodings


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int | None = None) -> int:
    """How many IDs ``a`` and ``b`` share at their start (at most ``limit``). By C-level slice
    compares, bisecting where they differ: a Python loop over the IDs made every comparison of a
    long prompt (a trajectory's breaks, the engine's prefix reuse) cost ~1 ms per 20 k tokens."""
    if not (isinstance(a, list) and isinstance(b, list)):
        a, b = list(a), list(b)  # a list never equals a tuple, whatever they hold
    n = min(len(a), len(b))
    if limit is not None:
        n = min(n, limit)
    if n <= 0 or a[0] != b[0]:
        return 0
    if a[:n] == b[:n]:  # the common case (the same prompt again, a prompt that extends another)
        return n
    lo, hi = 1, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
