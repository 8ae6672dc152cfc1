"""Strict JSON at the gateway's edge: what every request body must be before any field is read.

orjson does most of it (no ``NaN``/``Infinity``, valid UTF-8 without lone surrogates, no number
that overflows a double); a walk over the parsed value adds the bounds the rest of the gateway
relies on: nesting at most ``MAX_JSON_DEPTH`` levels and integers within the store's 64-bit range.
A value that passed here once is stored, replayed into chat templates and served back by the
control API, and each of those used to fail on it later (a 500 after recording, or forever).
Errors are ``BadRequest`` naming the problem and, where it can be found cheaply, the field.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from harnessrl.errors import BadRequest

#: The store's integer range (SQLite INTEGER, PostgreSQL BIGINT): a larger integer cannot be bound.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Nesting depth a body may have. Real requests stay far below it (a chat body with a deep JSON
#: schema in a tool: ~12); deeper ones only exhaust the recursion of the template, ``json.dumps``
#: when recording, and every reader after that.
MAX_JSON_DEPTH = 64
_UTF8_BOM = b"\xef\xbb\xbf"
_NON_JSON_CONSTANTS = ("NaN", "Infinity", "-Infinity")


#: A JSON error names its field (``param``) when it lies within this many characters of the start:
#: finding the field walks the text in Python, which must not stall the event loop on a huge body.
_PATH_SCAN_CHARS = 65_536
#: A named field stops after this many parts (deep nesting would otherwise name 1,000 of them).
_PATH_PARTS = 8
#: A string (or one still open where the scan stops) or a structural character.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*(?:"|$)|[{}\[\]:,]')


def _path_at(text: str, pos: int) -> str | None:
    """The field (``messages.0.content``) that character ``pos`` of the JSON ``text`` is in."""
    if pos > _PATH_SCAN_CHARS:
        return None
    frames: list[list[Any]] = []  # per open container: [key or index, is_object, expecting_a_key]
    for match in _JSON_TOKEN.finditer(text, 0, pos):
        token = match.group()
        if token[0] == '"':
            if frames and frames[-1][1] and frames[-1][2]:
                frames[-1][0] = token[1:-1] if token.endswith('"') else token[1:]
        elif token == "{":
            frames.append([None, True, True])
        elif token == "[":
            frames.append([0, False, False])
        elif token in "}]":
            if frames:
                frames.pop()
        elif frames and token == ":":
            frames[-1][2] = False
        elif frames:  # ","
            frame = frames[-1]
            if frame[1]:
                frame[0], frame[2] = None, True
            else:
                frame[0] += 1
    return ".".join([str(f[0]) for f in frames if f[0] is not None and not f[2]][:_PATH_PARTS]) or None


def _decode_error(exc: orjson.JSONDecodeError, raw: bytes, where: str) -> BadRequest:
    """A 400 that names what is wrong with the JSON, in words a client's author recognises."""
    message = exc.msg
    text = raw.decode("utf-8", "replace")  # orjson's ``pos`` counts characters, not bytes
    if text[exc.pos : exc.pos + 9].startswith(_NON_JSON_CONSTANTS):
        message = "NaN and Infinity are not JSON numbers (send null or a finite number)"
    elif "not valid UTF-8" in message:
        message = f"the body is not valid UTF-8 ({message})"
    elif "surrogate" in message:
        message = f"a string holds a lone UTF-16 surrogate, which is not valid Unicode ({message})"
    elif "infinity when parsed" in message:
        message = "a number is too large (integers must fit in 64 bits, floats must be finite)"
    elif "depth limit" in message or "recursion" in message:
        message = f"nesting is deeper than {MAX_JSON_DEPTH} levels"
    param = _path_at(text, exc.pos)
    at = f"{param}, char {exc.pos}" if param else f"char {exc.pos}"
    return BadRequest(f"{where} is not valid JSON: {message} (at {at})", param=param)


class _IntOutOfRange(ValueError):
    def __init__(self, literal: str):
        super().__init__(literal)
        self.literal = literal


def _bounded_int(literal: str) -> int:
    value = int(literal)
    if not INT64_MIN <= value <= INT64_MAX:
        raise _IntOutOfRange(literal)
    return value


def _int_message(literal: str) -> str:
    shown = literal if len(literal) <= 24 else f"{literal[:24]}... ({len(literal)} digits)"
    return f"integer {shown} is outside the 64-bit range"


def _scan(value: Any, depth: int = 1) -> tuple[str | None, Any, Any, bool]:
    """Walk an orjson-parsed ``value`` nested ``depth`` levels deep (1: the body itself): (what makes
    it unfit, or ``None``; the container and the value at fault; whether it holds an integral float
    past 64 bits, which may have been an integer literal that orjson read as a float)."""
    if type(value) is not dict and type(value) is not list:
        return None, None, None, False
    suspect = False
    stack: list[tuple[Any, int]] = [(value, depth)]
    while stack:
        node, depth = stack.pop()
        for child in node.values() if type(node) is dict else node:
            kind = type(child)
            if kind is dict or kind is list:
                if depth >= MAX_JSON_DEPTH:
                    return f"nesting is deeper than {MAX_JSON_DEPTH} levels", node, child, suspect
                stack.append((child, depth + 1))
            elif kind is int:
                if not INT64_MIN <= child <= INT64_MAX:
                    return _int_message(str(child)), node, child, suspect
            elif kind is float and abs(child) >= 2.0**63 and child.is_integer():
                suspect = True  # -(2**63) too: an integer literal just below it rounds to it
    return None, None, None, suspect


def _path_to(root: Any, parent: Any, child: Any) -> str | None:
    """The field of ``child`` inside ``parent`` inside ``root``, found by identity (errors only)."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        if node is parent:
            key = next((k for k, v in items if v is child), None)
            full = (*path, key) if key is not None else path
            return ".".join(str(p) for p in full[:_PATH_PARTS]) or None
        stack += [(v, (*path, k)) for k, v in items if isinstance(v, dict | list)]
    return None


def json_problem(value: Any) -> str | None:
    """What makes an orjson-parsed ``value`` unfit for the gateway (nesting deeper than
    ``MAX_JSON_DEPTH``, an integer outside int64), or ``None``."""
    return _scan(value)[0]


def within_bounds(value: Any, depth: int = 1) -> bool:
    """Whether a part of an orjson-parsed body, nested ``depth`` levels deep, passes what
    ``parse_json`` walks for (nesting, 64-bit integers), with no integral float past 64 bits (only
    the text tells those from integer literals: ``parse_json`` on the whole body decides)."""
    problem, _, _, suspect = _scan(value, depth)
    return problem is None and not suspect


def decode_json(raw: bytes | str, where: str = "request body") -> Any:
    """``raw`` decoded by orjson, strictly (see the module docstring), without the walk for nesting
    and integer bounds that ``parse_json`` adds: only for a caller that walks the value itself."""
    if isinstance(raw, bytes) and raw.startswith(_UTF8_BOM):
        raw = raw[len(_UTF8_BOM) :]  # RFC 8259 lets a parser ignore it; clients on Windows send one
    try:
        # orjson: ~10x faster than json on a long agent history, and strict: it refuses NaN,
        # Infinity, lone surrogates, invalid UTF-8 and numbers that overflow a double.
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        text = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
        raise _decode_error(exc, text, where) from None


def parse_json(raw: bytes | str, where: str = "request body") -> Any:
    """``raw`` as strict JSON (see the module docstring); ``BadRequest`` naming the problem and,
    where it can, the field (``param``)."""
    if isinstance(raw, bytes) and raw.startswith(_UTF8_BOM):
        raw = raw[len(_UTF8_BOM) :]
    data = decode_json(raw, where)
    problem, parent, child, suspect = _scan(data)
    if problem is not None:
        param = _path_to(data, parent, child)
        raise BadRequest(
            f"{where} is not valid JSON: {problem}" + (f" (at {param})" if param else ""), param=param
        )
    if suspect:
        # Only the text tells ``1e19`` (a float, fine) from ``10000000000000000000`` (an integer
        # literal past 64 bits, refused); the depth is bounded by now, so json's parser is safe.
        try:
            json.loads(raw, parse_int=_bounded_int)
        except _IntOutOfRange as exc:
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
            found = re.search(r"(?<![\w.\"])" + re.escape(exc.literal) + r"(?![\w.])", text)
            param = _path_at(text, found.start()) if found else None
            at = f" (at {param})" if param else ""
            raise BadRequest(
                f"{where} is not valid JSON: {_int_message(exc.literal)}{at}", param=param
            ) from None
    return data
