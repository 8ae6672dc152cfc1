"""A request body that fails validation, as the 400 that names its first offending field.

pydantic's error locations include union members' types (``stop.str``); ``from_validation_error``
keeps only the part that is a place in the body, so the client reads ``param="messages.0.role"``
and every problem in the message (``gateway.bodies`` calls it for every API's body).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from harnessrl.errors import BadRequest

__all__ = ["from_validation_error"]


def _field_path(loc: tuple[Any, ...], data: Any, missing: bool) -> str:
    """The part of pydantic's ``loc`` that names a place in the body.

    Union members add their type to the path (``stop.str``, ``stop.list[str]``); those are not
    fields, so the path stops where the body has no such key (a missing field keeps its name).
    """
    parts: list[str] = []
    node = data
    for i, part in enumerate(loc):
        in_dict = isinstance(node, dict) and isinstance(part, str) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if in_dict or in_list:
            node = node[part]  # type: ignore[index]
        elif missing and i == len(loc) - 1:
            pass
        else:
            break
        parts.append(str(part))
    return ".".join(parts)


def from_validation_error(exc: ValidationError, data: Any = None) -> BadRequest:
    """A 400 naming the first offending field (``messages.0.role``) and listing every problem."""
    problems = []
    first_param = None
    for err in exc.errors():
        if data is None:
            path = ".".join(str(part) for part in err["loc"])
        else:
            path = _field_path(tuple(err["loc"]), data, err["type"] == "missing")
        first_param = first_param or path or None
        problems.append(f"{path or 'body'}: {err['msg']}")
    return BadRequest("invalid request: " + "; ".join(dict.fromkeys(problems)), param=first_param)
