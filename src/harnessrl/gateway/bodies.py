"""Request bodies: reading them under a size limit, and validating them with pydantic models (those
of the model APIs are in ``body_models``).

Model-API bodies allow extra fields: harnesses send vendor fields (``drop_params``, ``metadata``,
``store``, ``user`` ...) that must be ignored, not rejected (the control API's bodies are ours and
strict: ``gateway.control.api``). Validation errors become a 400 naming the field
(``gateway.invalid_body.from_validation_error``).

Every body is strict JSON (``gateway.json_input.parse_json``) before any model sees it, and the
fields the store keeps in columns are typed to what it can hold (``body_models.StoreInt``; the
control API's ``StoreText``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.requests import ClientDisconnect, Request

from harnessrl.errors import BadRequest, PayloadTooLarge
from harnessrl.gateway.invalid_body import from_validation_error
from harnessrl.gateway.json_input import decode_json, parse_json, within_bounds

B = TypeVar("B", bound=BaseModel)


async def read_json(request: Request, max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object; 413 past ``max_bytes`` (declared or actually sent), 400 if it is not
    strict JSON (``parse_json``) or not an object."""
    return parse_body(await read_body(request, max_bytes))


def parse_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, strictly (``parse_json``: bounds, no lone surrogates, 64-bit
    integers); 400 if it is not."""
    return _json_object(parse_json(raw))


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The body's bytes; 413 past ``max_bytes`` (declared or actually sent), 400 if it is empty."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > max_bytes:
                raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {max_bytes}")
        except ValueError as exc:
            raise BadRequest("invalid Content-Length header") from exc
    # Chunked bodies have no Content-Length: count while reading so a huge body never sits in memory.
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise PayloadTooLarge(f"request body exceeds the limit of {max_bytes} bytes")
            chunks.append(chunk)
    except ClientDisconnect as exc:
        raise BadRequest("client disconnected while sending the body") from exc
    raw = b"".join(chunks)
    if not raw.strip():
        raise BadRequest("request body is empty; expected a JSON object")
    return raw


def _json_object(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise BadRequest(f"request body must be a JSON object, not {type(data).__name__}")
    return data


def validate_body(model: type[B], data: dict[str, Any]) -> B:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, data) from exc


# -- a body whose history repeats an already-checked one (``gateway.repeats``) ------------------


def decode_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, decoded strictly but not yet walked for ``parse_json``'s bounds:
    the caller must ``check_repeating_body`` it (or ``parse_json`` it) before using it."""
    return _json_object(decode_json(raw))


@dataclass(frozen=True)
class CheckedRest:
    """What the checks made of a body but its history list, for the rollout's next body: that part's
    JSON (``rest_json``), its characters of text, the model validated from the body, and its tools
    as the tokenizer prepared them for the template (``None``: no tools)."""

    json: bytes
    chars: int
    body: BaseModel
    tools: Any = None


def rest_json(data: dict[str, Any], key: str) -> bytes | None:
    """The JSON of ``data`` without ``data[key]`` (model, tools, sampling fields...): equal for two bodies
    exactly when everything but their history lists is the same JSON. ``None`` if orjson cannot say."""
    try:
        return orjson.dumps({k: v for k, v in data.items() if k != key})
    except TypeError:
        return None


def check_repeating_body(
    raw: bytes, data: dict[str, Any], key: str, same: int, *, rest_checked: bool = False
) -> None:
    """What ``parse_json`` checks, for a body whose list ``data[key]`` starts with ``same`` items of a
    body that passed it (the same JSON): only the rest is walked, and not even that where
    ``rest_checked`` (everything but the list is the same JSON as in that body). On any problem the
    whole body goes through ``parse_json``, so the error is the one it gives."""
    items = data.get(key)
    if isinstance(items, list) and (same or rest_checked):
        rest_fine = rest_checked or within_bounds({k: v for k, v in data.items() if k != key})
        fine = rest_fine and within_bounds(items[same:], depth=2)
    else:
        fine = within_bounds(data)
    if not fine:
        parse_json(raw)


def validate_tail(
    model: type[B], data: dict[str, Any], key: str, same: int, *, previous: B | None = None
) -> B:
    """``validate_body`` for a body whose list ``data[key]`` starts with ``same`` items that passed
    this model before (the same JSON): only the others are validated (the last item if none is new).
    ``previous``: the model validated from a body whose fields but ``key`` were the same JSON; it is
    returned as it is, once the new items pass (its fields are this body's).

    The model's ``key`` field then holds only the validated items: read the list from ``data``. A
    refusal is reported from the whole body, exactly as ``validate_body`` reports it.
    """
    items = data.get(key)
    if not isinstance(items, list) or not items or (not same and previous is None):
        return validate_body(model, data)
    try:
        if previous is not None:
            _items_adapter(model, key).validate_python(items[same:])
            return previous
        return model.model_validate({**data, key: items[same:] or items[-1:]})
    except ValidationError:
        return validate_body(model, data)


@functools.cache
def _items_adapter(model: type[BaseModel], key: str) -> TypeAdapter[Any]:
    """A validator of the list field ``key`` of ``model`` alone (built once per model and field)."""
    return TypeAdapter(model.model_fields[key].annotation)
