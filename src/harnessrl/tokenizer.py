"""The policy's tokenizer and chat template, without torch or transformers.

The gateway owns tokenization (it renders chat templates, encodes prompts, decodes sampled tokens and
streams text), and it must start fast and never import torch; importing ``transformers`` pulls torch
in. ``PolicyTokenizer`` therefore rebuilds just what the gateway needs from a Hugging Face model
folder with the ``tokenizers`` library and ``jinja2``:

- ``tokenizer.json`` (the fast tokenizer itself: normalizer, pre-tokenizer, model, added tokens);
- the chat template from ``chat_template.jinja``, ``chat_template.json`` or ``tokenizer_config.json``;
- special tokens from ``tokenizer_config.json``, stop IDs from ``generation_config.json`` and
  ``config.json``.

``render_chat`` renders exactly like transformers' ``apply_chat_template(tokenize=False)`` (same Jinja
environment: ``ImmutableSandboxedEnvironment`` with ``trim_blocks``/``lstrip_blocks``, the same
``tojson`` filter, ``raise_exception``, ``strftime_now``, the named special tokens as variables, and
the same message normalisation). Tests check this against transformers on the tiny model and SmolLM2.

``encode`` takes a faster, exact path for short ASCII texts where the tokenizer allows it
(``harnessrl.ascii_encoder``: the pre-tokenizer's regex in Python ``re`` and a cache of each piece's
BPE); other texts and tokenizers go through ``tokenizers`` as before.

Departures from transformers, on purpose: ``decode`` never applies ``clean_up_tokenization_spaces``
(the gateway needs decoding that agrees with streaming, token by token), and no BOS/EOS is ever added
by ``encode`` (chat templates write their own).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import orjson
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from harnessrl.ascii_encoder import AsciiEncoder
from harnessrl.errors import BadRequest, ConfigError

#: Named special tokens transformers passes to every chat template (``special_tokens_map``).
_NAMED_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
#: Names a message's reasoning travels under; transformers fills all of them from whichever is set.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_END_OF_TURN = "<|im_end|>"
#: Texts at least this long are encoded without holding the GIL (``PolicyTokenizer.encode``); shorter
#: ones (a call's new tail, usually) take a cheaper path: the ASCII fast path, or ``encode``.
GIL_FREE_ENCODE_CHARS = 32_768


def _token_content(value: Any) -> str | None:
    """A special token from tokenizer_config.json: a plain string or a serialized ``AddedToken`` dict."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return value.get("content")
    return str(value)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{str(path)!r} is not valid JSON: {exc}") from exc


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


# --- the Jinja environment, mirroring transformers.utils.chat_template_utils -------------------------


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


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # Jinja's own tojson HTML-escapes '<', '>', '&' and "'"; transformers replaces it with plain json.dumps.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


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


def compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template in the same sandboxed environment transformers uses."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env.from_string(source)


def _plain(value: Any) -> Any:
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
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _normalize_messages(messages: Iterable[Any]) -> list[dict[str, Any]]:
    """What transformers does before rendering: plain dicts, ``None`` values dropped, reasoning aliased."""
    out = []
    for message in _plain(list(messages)):
        if not isinstance(message, dict):
            raise BadRequest(f"chat messages must be objects, got {message!r}", param="messages")
        # Drop None values: templates handle a missing key but print "None" for content=None.
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


# --- streaming detokenization ------------------------------------------------------------------------


class StreamDecoder:
    """Turns a stream of token IDs into text pieces, holding back incomplete characters.

    Byte-level BPE (and SentencePiece byte fallback) can split one UTF-8 character over several tokens;
    decoding such a prefix yields U+FFFD. The decoder keeps a small window: it decodes
    ``ids[prefix:]`` and ``ids[prefix:read]`` and emits the difference once it no longer ends in U+FFFD.
    Decoding the window from one token back (not from ``read``) keeps decoders that strip a leading
    space (Metaspace) from eating the space of the first new token. ``"".join(pushes) + flush()``
    equals ``tokenizer.decode(all_ids)``.
    """

    def __init__(self, tokenizer: PolicyTokenizer, *, skip_special_tokens: bool = False):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # ids before this were already emitted

    def push(self, token_id: int) -> str:
        """Add one sampled token; return the text it completes (possibly ``""``)."""
        self._ids.append(int(token_id))
        prefix_text = self._tok.decode(self._ids[self._prefix : self._read], self._skip)
        new_text = self._tok.decode(self._ids[self._prefix :], self._skip)
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            piece = new_text[len(prefix_text) :]
            self._prefix = self._read
            self._read = len(self._ids)
            return piece
        return ""

    def flush(self) -> str:
        """Emit whatever is held back (an incomplete character decodes to U+FFFD, as in ``decode``)."""
        prefix_text = self._tok.decode(self._ids[self._prefix : self._read], self._skip)
        new_text = self._tok.decode(self._ids[self._prefix :], self._skip)
        self._prefix = self._read = len(self._ids)
        return new_text[len(prefix_text) :]


# --- the tokenizer -----------------------------------------------------------------------------------


class PolicyTokenizer:
    """A model folder's tokenizer and chat template, torch-free. Build with :meth:`from_dir`."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        name_or_path: str,
        chat_template: str | dict[str, str] | None,
        special_tokens: Mapping[str, str],
        generation_eos_ids: Sequence[int] = (),
        model_vocab_size: int | None = None,
        max_position_embeddings: int | None = None,
    ):
        self._tok = tokenizer
        self.name_or_path = name_or_path
        self.chat_template = chat_template
        self.special_tokens_map: dict[str, str] = {k: v for k, v in special_tokens.items() if v is not None}
        self._generation_eos_ids = tuple(generation_eos_ids)
        self.model_vocab_size = model_vocab_size
        self.max_position_embeddings = max_position_embeddings
        self._compiled: dict[str, jinja2.Template] = {}
        self._token_texts: dict[int, str] = {}  # token id -> decode([id]); bounded by the vocabulary
        # Template-ready copies of recent tool lists, by their JSON: an agent sends the same tools on
        # every call, and rebuilding them (``_plain``) costs more than the rest of a short render.
        # Shared safely: the sandbox is immutable, templates cannot change them.
        self._tools_cache: dict[bytes, Any] = {}
        self._tools_lock = threading.Lock()
        self._ascii = AsciiEncoder.build(tokenizer, name=name_or_path, max_chars=GIL_FREE_ENCODE_CHARS)

    @classmethod
    def from_dir(cls, path: str | Path) -> PolicyTokenizer:
        """Load from a Hugging Face model folder (``tokenizer.json`` is required)."""
        folder = Path(path)
        tok_file = folder / "tokenizer.json"
        if not tok_file.is_file():
            raise ConfigError(f"{str(folder)!r} has no tokenizer.json (only fast tokenizers are supported)")
        tokenizer = Tokenizer.from_file(str(tok_file))
        # Added tokens (and any padding/truncation saved with the file) must not change encode().
        tokenizer.no_padding()
        tokenizer.no_truncation()
        tok_cfg = _read_json(folder / "tokenizer_config.json")
        gen_cfg = _read_json(folder / "generation_config.json")
        model_cfg = _read_json(folder / "config.json")

        chat_template: str | dict[str, str] | None = tok_cfg.get("chat_template")
        if isinstance(chat_template, list):  # [{"name": ..., "template": ...}, ...]
            chat_template = {t["name"]: t["template"] for t in chat_template}
        ct_json = _read_json(folder / "chat_template.json")
        if ct_json.get("chat_template") is not None:
            chat_template = ct_json["chat_template"]
        if (folder / "chat_template.jinja").is_file():  # the newest format wins, as in transformers
            chat_template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
        extra_dir = folder / "additional_chat_templates"
        if extra_dir.is_dir():
            named = {p.stem: p.read_text(encoding="utf-8") for p in sorted(extra_dir.glob("*.jinja"))}
            if named:
                base = chat_template if isinstance(chat_template, dict) else {"default": chat_template}
                chat_template = {k: v for k, v in {**base, **named}.items() if v is not None}

        special = {name: _token_content(tok_cfg.get(name)) for name in _NAMED_SPECIAL_TOKENS}
        # The `text_config` nesting appears in multimodal configs; plain causal LMs keep keys at the top.
        text_cfg = model_cfg.get("text_config", model_cfg)
        eos_ids = _as_id_list(gen_cfg.get("eos_token_id")) + _as_id_list(text_cfg.get("eos_token_id"))
        return cls(
            tokenizer,
            name_or_path=str(folder),
            chat_template=chat_template,
            special_tokens={k: v for k, v in special.items() if v is not None},
            generation_eos_ids=eos_ids,
            model_vocab_size=text_cfg.get("vocab_size"),
            max_position_embeddings=text_cfg.get("max_position_embeddings"),
        )

    # --- encoding ------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token IDs of ``text``; no BOS/EOS added; special-token strings become their special IDs.

        A long text goes through ``encode_batch``, which gives the same IDs but releases the GIL
        while it works (``encode`` holds it throughout): the gateway encodes in a worker thread, and
        a 500 k-character prompt held its event loop (every other request) for seconds otherwise.
        A shorter ASCII text takes the fast path (:class:`AsciiEncoder`) where the tokenizer has one:
        the same IDs at a fraction of the cost, holding the GIL for a few milliseconds at most.
        Where the library has ``encode_batch_fast`` (tokenizers 0.21), every text goes through it:
        the same IDs, the GIL released too, and ~20% less CPU, as it tracks no character offsets
        (every model call encodes its new tail).
        """
        if self._ascii is not None:
            ids = self._ascii.encode(text)
            if ids is not None:
                return ids
        fast = getattr(self._tok, "encode_batch_fast", None)
        if fast is not None:
            return fast([text], add_special_tokens=False)[0].ids
        if len(text) >= GIL_FREE_ENCODE_CHARS:
            return self._tok.encode_batch([text], add_special_tokens=False)[0].ids
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` (no tokenization-space clean-up, so it agrees with :class:`StreamDecoder`)."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_texts(self, ids: Sequence[int]) -> list[str]:
        """``decode([i])`` for each ID (the per-token text of logprob entries), cached per ID."""
        cache = self._token_texts
        out = []
        for token_id in ids:
            text = cache.get(token_id)
            if text is None:
                text = cache[token_id] = self._tok.decode([token_id], skip_special_tokens=False)
            out.append(text)
        return out

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self._tok.id_to_token(int(i)) for i in ids]

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def stream_decoder(self, *, skip_special_tokens: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special_tokens=skip_special_tokens)

    # --- special tokens ------------------------------------------------------------------------------

    def _special_id(self, name: str) -> int | None:
        content = self.special_tokens_map.get(name)
        return None if content is None else self._tok.token_to_id(content)

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens_map.get("eos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._special_id("eos_token")

    @property
    def bos_token_id(self) -> int | None:
        return self._special_id("bos_token")

    @property
    def pad_token_id(self) -> int | None:
        """The pad token's ID, falling back to EOS (what engines pad with when the model has none)."""
        pad = self._special_id("pad_token")
        return self.eos_token_id if pad is None else pad

    @cached_property
    def stop_token_ids(self) -> tuple[int, ...]:
        """IDs that end a generation: EOS, the generation config's EOS IDs and ``<|im_end|>`` if present."""
        ids: list[int] = []
        im_end = self._tok.token_to_id(_END_OF_TURN)
        for tid in (self.eos_token_id, *self._generation_eos_ids, im_end):
            if tid is not None and tid not in ids:
                ids.append(tid)
        return tuple(ids)

    @property
    def vocab_size(self) -> int:
        """How many token IDs the tokenizer knows, added tokens included (like ``len(hf_tokenizer)``)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @cached_property
    def special_token_ids(self) -> set[int]:
        """IDs of the added tokens marked special (``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``...)."""
        return {tid for tid, tok in self._tok.get_added_tokens_decoder().items() if tok.special}

    # --- chat templates ------------------------------------------------------------------------------

    def get_chat_template(self, tools: list[dict[str, Any]] | None = None) -> str:
        """The template source, choosing ``tool_use`` over ``default`` when a model ships several."""
        template = self.chat_template
        if isinstance(template, dict):
            if tools is not None and "tool_use" in template:
                return template["tool_use"]
            if "default" in template:
                return template["default"]
            raise ConfigError(f"{self.name_or_path!r} has several chat templates and none named 'default'")
        if template is None:
            raise ConfigError(f"{self.name_or_path!r} has no chat template")
        return template

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """Render a conversation to the prompt text, exactly as ``apply_chat_template(tokenize=False)``.

        Template errors (``raise_exception`` in the template, a malformed message) become ``BadRequest``.
        """
        if not messages:
            raise BadRequest("a conversation needs at least one message", param="messages")
        source = self.get_chat_template(tools)
        compiled = self._compiled.get(source)
        if compiled is None:
            compiled = self._compiled[source] = compile_chat_template(source)
        variables = {**self.special_tokens_map, **template_kwargs}  # kwargs override, as in transformers
        try:
            return compiled.render(
                messages=_normalize_messages(messages),
                tools=self._template_tools(tools),
                documents=_plain(variables.pop("documents", None)),
                add_generation_prompt=add_generation_prompt,
                **_plain(variables),
            )
        except jinja2.exceptions.TemplateError as exc:
            raise BadRequest(f"chat template failed: {exc}", param="messages") from exc

    def _template_tools(self, tools: Any) -> Any:
        """``_plain(tools)``, cached for the last few distinct tool lists."""
        if tools is None:
            return None
        try:
            key = orjson.dumps(tools)
        except TypeError:  # not plain JSON (pydantic models, huge integers...): no caching
            return _plain(tools)
        with self._tools_lock:
            cached = self._tools_cache.get(key)
        if cached is None:
            cached = _plain(tools)
            with self._tools_lock:
                if len(self._tools_cache) >= 16:
                    self._tools_cache.pop(next(iter(self._tools_cache)))
                self._tools_cache[key] = cached
        return cached

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> list[int]:
        """``encode(render_chat(...))`` — what ``apply_chat_template(tokenize=True)`` returns."""
        return self.encode(self.render_chat(messages, tools, add_generation_prompt, **template_kwargs))

    def __repr__(self) -> str:
        return f"PolicyTokenizer({self.name_or_path!r}, vocab_size={self.vocab_size})"
