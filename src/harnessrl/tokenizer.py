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
environment and message normalisation, ``harnessrl.chat_template``, with the named special tokens as
variables). Tests check this against transformers on the tiny model and SmolLM2.

``encode`` takes a faster, exact path for short ASCII texts where the tokenizer allows it
(``harnessrl.ascii_encoder``: the pre-tokenizer's regex in Python ``re`` and a cache of each piece's
BPE); other texts and tokenizers go through ``tokenizers`` as before. ``decode`` and
``StreamDecoder`` join kept per-token texts where the decoder is byte-level and every token is whole
UTF-8 on its own (``texts_join``), which is what the library's decode gives then.

Departures from transformers, on purpose: ``decode`` never applies ``clean_up_tokenization_spaces``
(the gateway needs decoding that agrees with streaming, token by token), and no BOS/EOS is ever added
by ``encode`` (chat templates write their own).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
from tokenizers import Tokenizer

from harnessrl.ascii_encoder import AsciiEncoder
from harnessrl.chat_template import TemplateInputs, compile_chat_template, plain
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
_END_OF_TURN = "<|im_end|>"
#: Decoded both ways before ``PolicyTokenizer.texts_join`` is trusted: leading and doubled spaces,
#: newlines, digits, punctuation, multi-byte characters.
_DECODE_SAMPLE = (
    " Hello,  world!\n\n  x = f(1, 2) # ok\t\u00e9t\u00e9 \u4e16\u754c \U0001f600 'quoted' 3.14\r\n"
)
#: ``encode_conversation`` keeps the IDs of stretches between added tokens this long or longer...
STRETCH_KEPT_CHARS = 1024
#: ... up to this many characters of them in all (~10 MB of IDs at ~4 characters a token).
STRETCHES_KEPT_CHARS = 8_000_000
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
        # A token's own text is what it adds when nothing is held back (``texts_join``): then the
        # tokenizer's per-token texts are read directly, once per sampled token.
        self._texts = tokenizer._token_texts if not skip_special_tokens and tokenizer.texts_join else None

    def push(self, token_id: int) -> str:
        """Add one sampled token; return the text it completes (possibly ``""``)."""
        self._ids.append(int(token_id))
        texts = self._texts
        if texts is not None and self._read == len(self._ids) - 1:
            # Nothing held back: a whole-UTF-8 token adds exactly its own text (``texts_join``).
            text = texts.get(token_id)
            if text is None:
                text = self._tok.token_texts((token_id,))[0]
            if text and "\ufffd" not in text:
                self._prefix = self._read
                self._read += 1
                return text
        prefix_text = self._tok.decode(self._ids[self._prefix : self._read], self._skip)
        new_text = self._tok.decode(self._ids[self._prefix :], self._skip)
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            piece = new_text[len(prefix_text) :]
            self._prefix = self._read
            self._read = len(self._ids)
            return piece
        return ""

    def push_all(self, token_ids: Sequence[int]) -> list[str]:
        """``[push(t) for t in token_ids]``: the text each token completes. A stream's tokens arrive
        in batches (an engine read); when nothing is held back and each token is whole UTF-8, their
        texts are looked up in one pass instead of a call per token."""
        if len(token_ids) < 2:  # one token (a stream's first): ``push`` is as fast
            return [self.push(token_ids[0])] if token_ids else []
        if self._texts is not None and self._read == len(self._ids):
            found = self._tok.token_texts(token_ids)
            # None empty (a token with no text of its own goes through the window) and no partial
            # character among them: each adds exactly its own text, as ``push`` finds one by one.
            if "" not in found and "\ufffd" not in "".join(found):
                self._ids += map(int, token_ids)
                self._read = len(self._ids)
                self._prefix = self._read - 1
                return found
        return list(map(self.push, token_ids))

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
        self.special_tokens_map: dict[str, str] = {
            k: plain(v) for k, v in special_tokens.items() if v is not None
        }
        self._generation_eos_ids = tuple(generation_eos_ids)
        self.model_vocab_size = model_vocab_size
        self.max_position_embeddings = max_position_embeddings
        self._compiled: dict[str, jinja2.Template] = {}
        self._token_texts: dict[int, str] = {}  # token id -> decode([id]); bounded by the vocabulary
        # Template-ready messages and tool lists, kept by their JSON: an agent resends its history and
        # tools on every call, and preparing them costs more than the rest of a short render.
        self._template_inputs = TemplateInputs()
        self._ascii = AsciiEncoder.build(tokenizer, name=name_or_path, max_chars=GIL_FREE_ENCODE_CHARS)
        # ``encode_conversation``'s long stretches between added tokens, by their text.
        self._stretches: dict[str, tuple[int, ...]] = {}
        self._stretch_chars = 0
        self.stretches_kept_chars = STRETCHES_KEPT_CHARS
        self._stretches_lock = threading.Lock()

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

    def encode_conversation(self, text: str) -> list[int]:
        """``encode`` of a whole rendered conversation (a first call's prompt, a fallback's): the same
        IDs, with its long stretches between added tokens (a system prompt, the tool definitions)
        kept by their text for the next one. Every rollout of a run starts with the same system prompt
        and tools, thousands of tokens encoded again for each one otherwise. The tokenizer encodes the
        stretches between added tokens independently, so a kept stretch's IDs are exact anywhere.
        (A call's new tail is encoded with ``encode``: it is new text.)"""
        encoder = self._ascii
        if encoder is None or not text.isascii():
            return self.encode(text)
        kept = self._stretches
        out: list[int] = []
        for part in encoder.segments(text):
            if type(part) is int:
                out.append(part)
            elif len(part) < STRETCH_KEPT_CHARS:
                out += self.encode(part)
            else:
                ids = kept.get(part)
                if ids is None:
                    ids = tuple(self.encode(part))
                    self._keep_stretch(part, ids)
                out += ids
        return out

    def _keep_stretch(self, text: str, ids: tuple[int, ...]) -> None:
        with self._stretches_lock:  # oldest out first, within ``stretches_kept_chars`` characters
            kept = self._stretches
            if text in kept:
                return
            while kept and self._stretch_chars + len(text) > self.stretches_kept_chars:
                oldest = next(iter(kept))
                self._stretch_chars -= len(oldest)
                del kept[oldest]
            kept[text] = ids
            self._stretch_chars += len(text)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` (no tokenization-space clean-up, so it agrees with :class:`StreamDecoder`)."""
        if not skip_special_tokens and self.texts_join:
            text = "".join(self.token_texts(ids))
            if "\ufffd" not in text:  # every token whole UTF-8 on its own: the library's answer
                return text
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_texts(self, ids: Sequence[int]) -> list[str]:
        """``decode([i])`` for each ID (the per-token text of logprob entries), cached per ID."""
        cache = self._token_texts
        out = list(map(cache.get, ids))
        if None in out:
            for i, token_id in enumerate(ids):
                if out[i] is None:
                    text = cache.get(token_id)
                    if text is None:
                        text = cache[token_id] = self._tok.decode([token_id], skip_special_tokens=False)
                    out[i] = text
        return out  # type: ignore[return-value]

    @cached_property
    def texts_join(self) -> bool:
        """Whether decoding is joining the tokens' own texts wherever each is whole UTF-8.

        True of a byte-level decoder (``ByteLevel``: each token's bytes, joined, read as UTF-8): if no
        token's text holds U+FFFD, each is whole UTF-8 and the join reads the same. Not of decoders
        that look across tokens (SentencePiece's ``Metaspace`` drops the first token's leading
        space). Checked on a sample against the library's decode before it is trusted.
        """
        try:
            decoder = json.loads(self._tok.decoder.__getstate__()) if self._tok.decoder is not None else None
        except Exception:  # noqa: BLE001 - a tokenizers release that serializes differently: not trusted
            return False
        if not isinstance(decoder, dict) or decoder.get("type") != "ByteLevel":
            return False
        sample = self._tok.encode(_DECODE_SAMPLE, add_special_tokens=False).ids
        sample += sorted(self._tok.get_added_tokens_decoder())[:64]
        for ids in (sample, sample[1:], sample[::-1], [i for i in sample if i % 3]):
            texts = [self._tok.decode([i], skip_special_tokens=False) for i in ids]
            joined = "".join(texts)
            if "\ufffd" not in joined and joined != self._tok.decode(ids, skip_special_tokens=False):
                return False
        return True

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
        if template_kwargs:
            variables = plain(
                {**self.special_tokens_map, **template_kwargs}
            )  # kwargs override, as in transformers
            documents = variables.pop("documents", None)
        else:  # the usual render: the special tokens alone, plain strings already
            variables, documents = self.special_tokens_map, None
        try:
            return compiled.render(
                messages=self._template_inputs.messages(messages),
                tools=self._template_inputs.tools(tools),
                documents=documents,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except jinja2.exceptions.TemplateError as exc:
            raise BadRequest(f"chat template failed: {exc}", param="messages") from exc
        except (TypeError, ValueError) as exc:
            # What a template does with a value of the wrong type (a tool's description 5 added to a
            # string, a ``bos_token`` of 5 joined): the request's values, so the client's error.
            raise BadRequest(
                f"chat template failed on a value of the request: {type(exc).__name__}: {exc}",
                param="messages",
            ) from exc

    def template_tools(self, tools: list[dict[str, Any]] | None) -> Any:
        """The template-ready form of ``tools``: what ``render_chat`` makes of them, kept by their
        JSON. Passing it as ``tools`` to several renders prepares the list once, not each time."""
        return self._template_inputs.tools(tools)

    def tools_json(self, tools: Any) -> bytes:
        """``chat_template.tools_json(tools)``: for a list ``template_tools`` returned, the JSON it
        was kept by (no encoding); what sampled-token reuse compares tool lists by."""
        return self._template_inputs.tools_json(tools)

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
