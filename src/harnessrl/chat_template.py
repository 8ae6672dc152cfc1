"""Chat templates rendered exactly as transformers renders them, and cheaply enough for every call.

The environment mirrors ``transformers.utils.chat_template_utils``: ``ImmutableSandboxedEnvironment``
with ``trim_blocks``/``lstrip_blocks``, ``tojson`` as plain ``json.dumps``, ``raise_exception``,
``strftime_now``, a limited ``dict`` and ``namespace``, the ``generation`` tag and loop controls;
messages are made plain (pydantic models and dataclasses become dicts), with ``None`` values dropped
and the reasoning aliased under every name templates read it by. A tool call's arguments object (the
gateway parses them, as vLLM does) also joins strings as its JSON text (``_Arguments``), so a template
that joins them as the text transformers would hold renders as it would there.

The gateway renders two short conversations per model call (``gateway.conversation``), and in a
render that short most of the time went to the sandbox's machinery, not the template. What this
module adds for speed changes no output (the tests render both ways):

- ``message.role`` on a plain dict reads the item directly. The sandbox tries the attribute first
  and catches the ``AttributeError``; a plain dict has no attribute but ``dict``'s own, so for any
  other name the result is the item, or undefined, exactly as the sandbox gives it. ``loop.first``
  and a loop's other public attributes are read without the sandbox's checks, which pass for them,
  and a template's own macros are called without them too.
- ``tojson`` of a dict or list is kept per object. Every dict and list a template sees is a private
  copy made here (``TemplateInputs``) or one it built itself, and the immutable sandbox can change
  none of them, so an object's JSON never changes while it lives (the kept entry holds it alive).
- Each message's template form is kept by the message's JSON (``TemplateInputs.messages``): an
  agent resends its history, so most messages of a render were prepared for an earlier one. Only
  messages made of JSON types alone are kept so (a tuple or a NaN would not read back as itself).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import orjson
from jinja2.runtime import Context, LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment

from harnessrl.errors import BadRequest

#: Names a message's reasoning travels under; transformers fills all of them from whichever is set.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class _GenerationTag(jinja2.ext.Extension):
    """Accept ``{% generation %}...{% endgeneration %}`` (assistant-mask markers) and render the body as is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Callable[[], str]) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


#: ``tojson`` results kept per dict or list object: (id, arguments) -> (the object, its JSON).
_JSON_KEPT: dict[tuple[Any, ...], tuple[Any, str]] = {}
_JSON_KEPT_MAX = 1024
_JSON_LOCK = threading.Lock()


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # Jinja's own tojson HTML-escapes '<', '>', '&' and "'"; transformers replaces it with plain json.dumps.
    key = None
    if type(x) is dict or type(x) is list or type(x) is _Arguments:  # copies made here, never changed
        try:
            key = (
                id(x),
                ensure_ascii,
                indent,
                tuple(separators) if separators is not None else None,
                sort_keys,
            )
            hash(key)
        except TypeError:  # unhashable arguments: nothing kept
            key = None
        else:
            kept = _JSON_KEPT.get(key)
            if kept is not None and kept[0] is x:
                return kept[1]
    text = json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    if key is not None:
        with _JSON_LOCK:
            if len(_JSON_KEPT) >= _JSON_KEPT_MAX:
                del _JSON_KEPT[next(iter(_JSON_KEPT))]
            _JSON_KEPT[key] = (x, text)
    return text


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """``dict`` for templates, limited like transformers' so attribute tricks cannot escape the sandbox."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """A Jinja namespace that refuses underscore-prefixed attributes (as transformers' does)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - same signature trick as jinja2.utils.Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}."
            )


#: Every attribute a plain dict has: for any other name, ``getattr`` on one raises.
_DICT_ATTRIBUTES = frozenset(dir(dict))
#: A loop's public attributes (``loop.first``, ``loop.previtem``...), all of which the sandbox allows.
_LOOP_ATTRIBUTES = frozenset(name for name in dir(LoopContext) if not name.startswith("_"))


class _Environment(ImmutableSandboxedEnvironment):
    """transformers' sandbox, with the two lookups a chat template makes most taken directly:
    ``dict_obj.name`` read as the item without a caught exception, and a loop's public attributes
    without the checks for attributes that could reach Python's internals or mutate a container."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        kind = type(obj)
        if kind is dict and type(attribute) is str and attribute not in _DICT_ATTRIBUTES:
            # What the sandbox returns here: getattr fails, so the item, or undefined.
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        if kind is LoopContext and attribute in _LOOP_ATTRIBUTES:
            return getattr(obj, attribute)  # what the sandbox returns after finding it safe
        return super().getattr(obj, attribute)

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - jinja's signature
        if type(__obj) is Macro:
            # What the sandbox then ``Context.call`` do for a template's own macro (always safe to
            # call; its ``__call__`` takes the evaluation context), without their lookups.
            kwargs.pop("_block_vars", None)
            kwargs.pop("_loop_vars", None)
            try:
                return __obj.__call__(__context.eval_ctx, *args, **kwargs)
            except StopIteration:
                return __self.undefined(
                    "value was undefined because a callable raised a StopIteration exception"
                )
        return super().call(__context, __obj, *args, **kwargs)


#: What gpt-oss's official template raises for an assistant tool-call turn with both a text and a
#: reasoning (``_HarmonyTemplate``).
_HARMONY_BOTH_REFUSED = "Cannot pass both content and thinking in an assistant message with tool calls"
#: What closes the analysis message and opens a commentary one without a recipient: a preamble.
_HARMONY_PREAMBLE = "<|end|><|start|>assistant<|channel|>commentary<|message|>"


class _HarmonyTemplate(jinja2.Template):
    """gpt-oss's template, given a tool-call turn with a preamble as gpt-oss sampled it.

    gpt-oss writes its reasoning (analysis), a preamble to the user (a commentary message without a
    recipient) and then the call; the gateway answers that turn with the preamble as ``content``
    beside ``reasoning_content``, and the harness sends both back. The official template refuses a
    tool-call turn with both (every next request of the rollout was a 400), as it renders a tool-call
    turn's ``content`` as analysis. vLLM's harmony rendering keeps both, the preamble on the
    commentary channel; here the reasoning the template renders goes on with the preamble's
    commentary message, so the turn renders as it was sampled: analysis, commentary, call. Where the
    template drops the turn's reasoning (a final answer follows it) the preamble goes with it."""

    def render(self, *args: Any, **kwargs: Any) -> str:
        messages = kwargs.get("messages")
        if type(messages) is list:
            kwargs["messages"] = [_preamble_in_commentary(m) for m in messages]
        return super().render(*args, **kwargs)


def _preamble_in_commentary(message: Any) -> Any:
    if not (
        type(message) is dict
        and message.get("role") == "assistant"
        and message.get("tool_calls")
        and isinstance(message.get("content"), str)
        and message["content"]
        and isinstance(message.get("thinking"), str)
        and message["thinking"]
    ):
        return message
    reasoning = message["thinking"] + _HARMONY_PREAMBLE + message["content"]
    # A new dict: the one given is kept for later renders (``TemplateInputs``).
    return {**message, "content": "", **dict.fromkeys(REASONING_FIELDS, reasoning)}


def compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template in the same sandboxed environment transformers uses."""
    env = _Environment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    if _HARMONY_BOTH_REFUSED in source:
        env.template_class = _HarmonyTemplate
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    template = env.from_string(source)
    # Its globals are a ChainMap over the environment's, copied into every render's context: flat,
    # that copy is a dict's (nothing changes the environment's after this).
    template.globals = dict(template.globals)
    return template


def plain(value: Any) -> Any:
    """Rebuild template inputs from plain JSON types (pydantic models and dataclasses become dicts)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return plain(value.model_dump())
    return f"<{type(value).__name__}>"


class _Arguments(dict):  # type: ignore[type-arg]
    """A tool call's arguments object as a template gets it: a mapping (``tojson`` writes it, as vLLM
    passes it), that also joins a string as its JSON text. DeepSeek's templates write ``'<｜tool▁sep｜>'
    + tool['function']['arguments']``, where the OpenAI message transformers renders holds that text;
    a plain dict failed the render, so every tool round trip was a 400."""

    def __add__(self, other: Any) -> Any:
        return json.dumps(self, ensure_ascii=False) + other if isinstance(other, str) else NotImplemented

    def __radd__(self, other: Any) -> Any:
        return other + json.dumps(self, ensure_ascii=False) if isinstance(other, str) else NotImplemented


def _with_arguments(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or type(function.get("arguments")) is not dict:
        return call
    return {**call, "function": {**function, "arguments": _Arguments(function["arguments"])}}


def template_message(message: Any) -> dict[str, Any]:
    """What transformers makes of a message before rendering: a plain dict, ``None`` values dropped,
    the reasoning aliased; tool-call arguments objects also join strings (``_Arguments``)."""
    message = plain(message)
    if not isinstance(message, dict):
        raise BadRequest(f"chat messages must be objects, got {message!r}", param="messages")
    # Drop None values: templates handle a missing key but print "None" for content=None.
    message = {k: v for k, v in message.items() if v is not None}
    if type(message.get("tool_calls")) is list:
        message["tool_calls"] = [_with_arguments(call) for call in message["tool_calls"]]
    reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is not None:
        message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    return message


_JSON_SCALARS = frozenset({str, int, bool, type(None)})
_INFINITY = float("inf")


def _plain_json(value: Any) -> bool:
    """Whether ``value`` is made of exact dicts, lists, strings, integers, finite floats, booleans and
    ``None`` only: then its JSON says all there is to it (a tuple or a NaN would not read back as
    itself). Dict keys need no look: orjson refuses any but strings."""
    stack = [value]
    pop, extend = stack.pop, stack.extend
    while stack:
        node = pop()
        kind = type(node)
        if kind is dict:
            extend(node.values())
        elif kind is list:
            extend(node)
        elif kind is float:
            if not -_INFINITY < node < _INFINITY:  # NaN compares false too
                return False
        elif kind not in _JSON_SCALARS:
            return False
    return True


def tools_json(tools: Any) -> bytes:
    """A tool list's JSON as ``TemplateInputs`` keeps it by (``orjson.dumps``, key order kept);
    ``b""`` for no tools. What reuse compares to tell whether two prompts had the same tools."""
    if not tools:
        return b""
    try:
        return orjson.dumps(tools)
    except TypeError:  # integers past 64 bits, a value orjson does not know: the lenient json
        return json.dumps(tools, ensure_ascii=False, separators=(",", ":"), default=repr).encode()


class TemplateInputs:
    """A tokenizer's template-ready messages and tool lists, kept by their JSON for the next render.

    Thread-safe (renders run on the event loop and in worker threads); bounded. The kept objects are
    shared between renders, which is safe: the sandbox is immutable and nothing else sees them.
    """

    MAX_MESSAGES = 1024
    MAX_TOOL_LISTS = 16

    def __init__(self) -> None:
        self._messages: dict[bytes, dict[str, Any]] = {}
        self._tools: dict[bytes, Any] = {}
        # id of a kept tool list -> (the list, its JSON): the JSON a caller asks for again
        # (``tools_json``) is at hand, and a kept list is known for one in O(1).
        self._kept_tools: dict[int, tuple[Any, bytes]] = {}
        self._lock = threading.Lock()

    def messages(self, messages: Iterable[Any]) -> list[dict[str, Any]]:
        return [self._message(m) for m in messages]

    def _message(self, message: Any) -> dict[str, Any]:
        return self._kept(self._messages, message, template_message, self.MAX_MESSAGES)

    def tools(self, tools: Any) -> Any:
        """``plain(tools)``, kept for the last few distinct tool lists; a kept list is its own form
        (a caller preparing tools once for several renders passes what this returned)."""
        if tools is None:
            return None
        kept = self._kept_tools.get(id(tools))
        if kept is not None and kept[0] is tools:
            return tools
        return self._kept(self._tools, tools, plain, self.MAX_TOOL_LISTS)

    def tools_json(self, tools: Any) -> bytes:
        """``tools_json(tools)``, taken from where it was kept for a list ``tools`` returned."""
        kept = self._kept_tools.get(id(tools)) if tools else None
        if kept is not None and kept[0] is tools:
            return kept[1]
        return tools_json(tools)

    def _kept(self, table: dict[bytes, Any], value: Any, build: Callable[[Any], Any], limit: int) -> Any:
        """``build(value)``, kept in ``table`` by ``value``'s JSON text."""
        if not _plain_json(value):  # pydantic models, tuples...: its JSON would not say it all
            return build(value)
        try:
            key = orjson.dumps(value)
        except TypeError:  # integers past 64 bits
            return build(value)
        kept = table.get(key)
        if kept is None:
            kept = build(value)
            self._keep(table, key, kept, limit)
        return kept

    def _keep(self, table: dict[bytes, Any], key: bytes, value: Any, limit: int) -> None:
        with self._lock:
            if len(table) >= limit:
                oldest = table.pop(next(iter(table)))
                if table is self._tools:
                    self._kept_tools.pop(id(oldest), None)
            replaced = table.get(key)  # another thread kept the same list meanwhile
            table[key] = value
            if table is self._tools:
                if replaced is not None:
                    self._kept_tools.pop(id(replaced), None)
                self._kept_tools[id(value)] = (value, key)
