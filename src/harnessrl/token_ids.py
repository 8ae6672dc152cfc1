"""``TokenIds``: a list of token IDs that keeps the two encodings every model call needs of its prompt.

Each call sends its whole prompt to the engine as a JSON array and the store keeps it as int32
bytes, though all but the last few hundred of its tokens are the previous call's prompt and answer.
Encoding 16 k IDs costs ~0.15 ms each way (``orjson.dumps``, ``struct.pack``): together a large
share of the gateway's CPU per call. A ``TokenIds`` keeps each encoding once it is made, and one
built from earlier ones (``TokenIds.joined``) makes its encodings from theirs plus its new tokens',
so a call encodes only what it adds.

It is a ``list`` (equal to one, usable wherever one is), and every method that changes it drops the
kept encodings first, so they can never describe other IDs than the list holds.
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
    return struct.pack(_LITTLE_ENDIAN_INT32.format(len(ids)), *ids)


def json_array(ids: Sequence[int]) -> bytes:
    """``ids`` as a compact JSON array (what ``orjson.dumps(list(ids))`` gives)."""
    if isinstance(ids, TokenIds):
        return ids.json()
    return orjson.dumps(ids if isinstance(ids, list) else list(ids))


def _join_arrays(arrays: Iterable[bytes]) -> bytes:
    inner = [a[1:-1] for a in arrays if len(a) > 2]
    return b"[" + b",".join(inner) + b"]"


class TokenIds(list[int]):
    """Token IDs with their int32 bytes (``packed``) and JSON array (``json``) kept once computed."""

    __slots__ = ("_json", "_packed")

    def __init__(self, ids: Iterable[int] = ()) -> None:
        super().__init__(ids)
        self._packed: bytes | None = None
        self._json: bytes | None = None

    @classmethod
    def joined(cls, *parts: Sequence[int]) -> TokenIds:
        """The concatenation of ``parts``. Each encoding the first part already has is extended with
        the others' (encoded now: they are the short new tokens), not made again from the whole."""
        out = cls()
        for part in parts:
            list.extend(out, part)
        first = parts[0] if parts else None
        if isinstance(first, TokenIds):
            if first._packed is not None:
                out._packed = b"".join(int32_bytes(part) for part in parts)
            if first._json is not None:
                out._json = _join_arrays(json_array(part) for part in parts)
        return out

    def packed(self) -> bytes:
        """Little-endian int32 bytes (``struct.error`` if a value does not fit); kept."""
        if self._packed is None:
            self._packed = struct.pack(_LITTLE_ENDIAN_INT32.format(len(self)), *self)
        return self._packed

    def json(self) -> bytes:
        """The compact JSON array; kept."""
        if self._json is None:
            self._json = orjson.dumps(list(self))
        return self._json

    def forget_encodings(self) -> None:
        """Drop the kept encodings (memory): they are made again if asked for."""
        self._packed = self._json = None

    # -- every change drops the encodings -------------------------------------------------------------

    def _changed(self) -> None:
        self._packed = self._json = None

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
