"""Text tool-call arguments typed by the request's JSON schema, as vLLM types them
(``coerce_to_schema_type``): the XML formats (``qwen_xml``, ``glm``) write every argument as text.

A string stays text; integer, number, boolean, null, object and array values are parsed; a value of
an unknown type is parsed as JSON when it is JSON; a parameter the schema does not describe stays
text. Nothing is handed out that the next request could not carry back (no NaN/Infinity, no integer
past 64 bits).
"""

from __future__ import annotations

import json
import math
from typing import Any

from harnessrl.gateway.parsers.tools.base import Tools, echo_stable, model_json

# vLLM's spellings of JSON-schema types (``coerce_to_schema_type``), so a loosely written schema
# types a value the same way there and here.
_TYPE_ALIASES = {
    **dict.fromkeys(("str", "text", "varchar", "char", "enum"), "string"),
    **dict.fromkeys(
        ("int", "int32", "int64", "uint", "uint32", "uint64", "long", "short", "unsigned"), "integer"
    ),
    **dict.fromkeys(("float", "float32", "float64", "double"), "number"),
    "bool": "boolean",
    "dict": "object",
    **dict.fromkeys(("arr", "list", "sequence"), "array"),
}
# bool before int: True is an int too.
_ENUM_TYPES = (
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)


def tool_properties(tools: Tools, name: str) -> dict[str, Any]:
    """The ``properties`` of the first request tool called ``name`` ({} when there is none)."""
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name") == name:
            parameters = function.get("parameters")
            properties = parameters.get("properties") if isinstance(parameters, dict) else None
            return properties if isinstance(properties, dict) else {}
    return {}


def schema_types(schema: dict[str, Any]) -> set[str]:
    """Every type a schema allows: ``type``, the types of ``enum`` values, ``anyOf``/``oneOf``/``allOf``."""
    types: set[str] = set()
    declared = schema.get("type")
    for t in declared if isinstance(declared, list) else [declared]:
        if isinstance(t, str):
            types.add(t)
    enum = schema.get("enum")
    for value in enum if isinstance(enum, list) else ():
        if value is None:
            types.add("null")
        else:
            types.update([t for kind, t in _ENUM_TYPES if isinstance(value, kind)][:1])
    for key in ("anyOf", "oneOf", "allOf"):
        choices = schema.get(key)
        for choice in choices if isinstance(choices, list) else ():
            if isinstance(choice, dict):
                types |= schema_types(choice)
    return types or {"string"}


def _json_value(text: str) -> tuple[bool, Any]:
    """``(True, value)`` when ``text`` is JSON that serializes back (no NaN/Infinity, no integer past
    64 bits), else ``(False, None)``."""
    ok, value = model_json(text)
    # A bare value: the bounds walk looks inside containers only, and orjson reads an integer
    # literal past 64 bits as a float (1e+23 for 10**23). The literal, not the float, is what the
    # model wrote.
    big = ok and type(value) is float and value.is_integer() and abs(value) >= 2.0**63
    if big and isinstance(json.loads(text), int):
        return False, None
    return ok, value


def coerce_value(value: str, schema: dict[str, Any]) -> Any:
    """A text value typed by its schema, trying null, integer, number, boolean, object, array, string."""
    types = {_TYPE_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in schema_types(schema)}
    for candidate in ("null", "integer", "number", "boolean", "object", "array", "string"):
        if candidate not in types:
            continue
        if candidate == "null" and value.lower() == "null":
            return None
        if candidate == "string":
            return value
        if candidate == "integer":
            try:
                # Like vLLM: Python's int(), so " 7 " and "1_000" count. Past 64 bits the call is
                # refused as a whole (``arguments_fit``): the next request could not carry it.
                return int(value)
            except ValueError:
                pass
        if candidate == "number":
            try:
                number = float(value)
            except ValueError:
                continue
            if math.isfinite(number):
                # An integral number is written as an integer where one can be (1e30 stays a float),
                # the one its decimal spells (``echo_stable``: what a harness's round trip keeps).
                return echo_stable(number)
        if candidate == "boolean":
            word = value.lower().strip()
            if word in ("true", "1", "false", "0"):
                return word in ("true", "1")
        if candidate in ("object", "array"):
            ok, parsed = _json_value(value)
            if ok:
                return parsed
    # No allowed type fits (or the type is unknown): vLLM's best effort is any JSON, else the text.
    ok, parsed = _json_value(value)
    return parsed if ok else value


def typed_arguments(tools: Tools, name: str, raw: dict[str, str]) -> dict[str, Any]:
    """Each raw text argument typed by the tool's schema; arguments it does not describe stay text."""
    properties = tool_properties(tools, name)
    typed: dict[str, Any] = {}
    for key, value in raw.items():
        schema = properties.get(key)
        typed[key] = coerce_value(value, schema) if isinstance(schema, dict) else value
    return typed
