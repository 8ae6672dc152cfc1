"""A tiny random Qwen3-architecture model with a locally trained tokenizer, for tests and demos.

Everything here is torch-free and transformers-free, on purpose: the scripted engine and the gateway
use the tiny model's tokenizer, and they must not need torch. So instead of ``save_pretrained`` we
write the Hugging Face folder ourselves:

- ``tokenizer.json``: a byte-level BPE trained in seconds with ``tokenizers`` on offline text (a fixed
  list of Python stdlib modules' source, plus generated chat / tool-call / shell / JSON snippets so that
  agent traffic tokenizes sensibly). The normalizer and pre-tokenizer are exactly Qwen2's (NFC, Qwen's
  split regex, byte-level), so transformers' ``Qwen2Tokenizer`` — which rebuilds that pipeline from the
  vocab and merges — produces the same IDs.
- ``config.json`` (``model_type="qwen3"``; with ``qwen2`` transformers would behave the same today, but
  qwen3 is what the brief and the Qwen3-family chat format call for), ``generation_config.json``.
- ``model.safetensors``: random weights from numpy's PCG64 seeded generator, written in the
  safetensors format by hand (it is a JSON header plus raw little-endian arrays).
- ``chat_template.jinja``: harnessrl's ChatML+tools template.

``pad = eos = <|im_end|>``. Same seed and parameters give byte-identical files. ``tiny_model_dir``
builds once into a cache folder keyed by a hash of everything that shapes the output; concurrent
builders each build into a temporary folder and atomically rename it into place (first one wins).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import struct
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers.trainers import BpeTrainer

from harnessrl.engines.chat_templates import chatml_tools_template

#: Bump when the build changes in a way the parameters do not capture (invalidates caches).
BUILD_FORMAT = 1

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # IDs 0, 1, 2
# Non-special added tokens, as in Qwen: they always encode to one ID but are kept by skip_special_tokens.
ADDED_TOKENS = ("<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>")

# Qwen2's pre-tokenization regex (transformers.models.qwen2.tokenization_qwen2.PRETOKENIZE_REGEX).
_QWEN_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Stdlib modules whose source makes the corpus: code, docstrings (English), a little JSON/shell.
_CORPUS_MODULES = (
    "json/__init__.py",
    "json/decoder.py",
    "json/encoder.py",
    "argparse.py",
    "pathlib.py",
    "subprocess.py",
    "shutil.py",
    "textwrap.py",
    "string.py",
    "dataclasses.py",
    "functools.py",
    "collections/__init__.py",
    "typing.py",
    "logging/__init__.py",
    "unittest/case.py",
    "asyncio/tasks.py",
    "http/client.py",
    "os.py",
    "re/__init__.py",
    "tempfile.py",
    "difflib.py",
    "csv.py",
    "datetime.py",
)


def _generated_snippets(seed: int) -> list[str]:
    """Chat-format, tool-call, shell and JSON snippets (deterministic for ``seed``)."""
    rng = random.Random(seed)
    commands = [
        "ls -la",
        "cat README.md",
        "git status",
        "git diff",
        "python -m pytest -q",
        "grep -rn 'def main' src/",
        "find . -name '*.py' | head",
        "sed -n '1,40p' setup.py",
        "pip install -e .",
        "echo hello > out.txt",
        "python3 script.py --help",
        "cd /testbed && ls",
    ]
    words = [
        "the",
        "file",
        "function",
        "test",
        "error",
        "fix",
        "bug",
        "value",
        "return",
        "import",
        "module",
        "class",
        "line",
        "path",
        "output",
    ]
    files = [
        "src/app.py",
        "tests/test_app.py",
        "README.md",
        "setup.cfg",
        "pyproject.toml",
        "main.go",
        "lib.rs",
    ]
    out = []
    for _ in range(3000):
        cmd = rng.choice(commands)
        args = {"command": cmd}
        if rng.random() < 0.3:
            args = {"path": rng.choice(files), "old_str": rng.choice(words), "new_str": rng.choice(words)}
        name = rng.choice(["bash", "str_replace_editor", "read_file", "write_file", "submit"])
        call = json.dumps({"name": name, "arguments": args})
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12))).capitalize() + "."
        n = rng.randint(0, 999)
        out.append(
            f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            f"<|im_start|>user\n{sentence} Please check {rng.choice(files)}.<|im_end|>\n"
            f"<|im_start|>assistant\n<think>\n{sentence}\n</think>\n\nI will run `{cmd}`.\n"
            f"<tool_call>\n{call}\n</tool_call><|im_end|>\n"
            f"<|im_start|>user\n<tool_response>\n{rng.choice(files)}:{n}: {sentence}\n</tool_response><|im_end|>\n"
            f'{{"type": "function", "function": {{"name": "{name}", "parameters": {{"type": "object"}}}}}}\n'
        )
    return out


def _corpus(seed: int) -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for rel in _CORPUS_MODULES:
        path = stdlib / rel
        if path.is_file():
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
    return texts + _generated_snippets(seed)


def build_tiny_tokenizer(vocab_size: int = 4096, *, seed: int = 0) -> Tokenizer:
    """Train the tiny byte-level BPE (a few seconds). ``vocab_size`` counts every token, added ones too."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = BpeTrainer(
        vocab_size=vocab_size - len(ADDED_TOKENS),
        min_frequency=2,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return tok


def _write_safetensors(path: Path, tensors: dict[str, Any]) -> None:
    """Write float32 numpy arrays in the safetensors format (sorted names, 8-byte-aligned header)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    blobs = []
    for name in sorted(tensors):
        arr = tensors[name].astype("<f4", copy=False)
        data = arr.tobytes(order="C")
        header[name] = {
            "dtype": "F32",
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for blob in blobs:
            fh.write(blob)


def _random_weights(cfg: dict[str, Any], seed: int) -> dict[str, Any]:
    import numpy as np  # only the weight build needs numpy

    rng = np.random.Generator(np.random.PCG64(seed))
    hidden, inter, head_dim = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    n_q, n_kv, vocab = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    std = cfg["initializer_range"]

    def normal(*shape: int, scale: float = std) -> Any:
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)

    w = {"model.embed_tokens.weight": normal(vocab, hidden, scale=1.0)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = normal(n_q * head_dim, hidden)
        w[p + "self_attn.k_proj.weight"] = normal(n_kv * head_dim, hidden)
        w[p + "self_attn.v_proj.weight"] = normal(n_kv * head_dim, hidden)
        w[p + "self_attn.o_proj.weight"] = normal(hidden, n_q * head_dim)
        w[p + "self_attn.q_norm.weight"] = np.ones(head_dim, dtype=np.float32)
        w[p + "self_attn.k_norm.weight"] = np.ones(head_dim, dtype=np.float32)
        w[p + "mlp.gate_proj.weight"] = normal(inter, hidden)
        w[p + "mlp.up_proj.weight"] = normal(inter, hidden)
        w[p + "mlp.down_proj.weight"] = normal(hidden, inter)
        w[p + "input_layernorm.weight"] = np.ones(hidden, dtype=np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(hidden, dtype=np.float32)
    w["model.norm.weight"] = np.ones(hidden, dtype=np.float32)
    # A larger output scale than 0.02 gives peaked next-token distributions (logit std ~1), so greedy
    # decoding has clear winners and is not decided by float rounding between batched and single runs.
    w["lm_head.weight"] = normal(vocab, hidden, scale=0.1)
    return w


def _model_config(
    vocab_size: int,
    hidden_size: int,
    intermediate_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    max_position_embeddings: int,
    eos_id: int,
) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": hidden_size // num_heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-6,
        "use_cache": True,
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": num_layers,
        "layer_types": ["full_attention"] * num_layers,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "eos_token_id": eos_id,
        "pad_token_id": eos_id,
        "dtype": "float32",
    }


def build_tiny_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 4096,
    hidden_size: int = 128,
    intermediate_size: int = 384,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_position_embeddings: int = 4096,
    weights: bool = True,
) -> Path:
    """Write a tiny random Qwen3 model folder to ``out_dir`` (created; must not exist or be empty).

    ``weights=False`` writes only the tokenizer, chat template and configs (no numpy needed).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tiny_tokenizer(vocab_size, seed=seed)
    tok.save(str(out / "tokenizer.json"))
    im_end = tok.token_to_id("<|im_end|>")
    endoftext = tok.token_to_id("<|endoftext|>")
    real_vocab = tok.get_vocab_size(with_added_tokens=True)
    cfg = _model_config(
        real_vocab,
        hidden_size,
        intermediate_size,
        num_layers,
        num_heads,
        num_kv_heads,
        max_position_embeddings,
        im_end,
    )
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    gen_cfg = {"eos_token_id": [im_end, endoftext], "pad_token_id": im_end, "bos_token_id": None}
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t in SPECIAL_TOKENS,
        }
        for t in SPECIAL_TOKENS + ADDED_TOKENS
    }
    tok_cfg = {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|im_end|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "errors": "replace",
        "model_max_length": max_position_embeddings,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    (out / "chat_template.jinja").write_text(chatml_tools_template())
    if weights:
        _write_safetensors(out / "model.safetensors", _random_weights(cfg, seed))
    return out


def _cache_key(params: dict[str, Any]) -> str:
    """Hash of everything that shapes the build, so a changed template or corpus gets a fresh folder."""
    material = {
        "format": BUILD_FORMAT,
        "params": params,
        "template": chatml_tools_template(),
        "python": list(sys.version_info[:2]),  # the stdlib corpus can change between Python versions
        "tokenizers": tokenizers.__version__,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]


def default_cache_dir() -> Path:
    """Where built and converted models live: ``$HARNESSRL_CACHE_DIR``, else ``~/.cache/harnessrl``."""
    override = os.environ.get("HARNESSRL_CACHE_DIR")
    return Path(override) if override else Path.home() / ".cache" / "harnessrl"


def build_folder_atomically(target: Path, build: Callable[[Path], object]) -> Path:
    """``target``, written by ``build(tmp)`` into a private temporary folder beside it and renamed
    into place: safe when several processes build the same folder at once (the first rename wins,
    the others' work is dropped), and a crash never leaves a half-written ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, target)  # atomic on POSIX; fails if another builder got there first
        except OSError:
            if not target.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def tiny_model_dir(cache_dir: str | Path | None = None, *, seed: int = 0, weights: bool = True) -> Path:
    """Path of the tiny model, building it on first use into ``cache_dir`` (default ``~/.cache/harnessrl``).

    Safe under concurrency: each builder writes a private temporary folder and renames it into place.
    ``weights=False`` returns a tokenizer-only folder (no numpy needed) — but a full folder is reused
    when one is already cached, since it holds the same tokenizer files.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = _cache_key({"seed": seed})
    full = root / f"tiny-{key}"
    # A full folder also serves tokenizer-only callers: it holds the same tokenizer files.
    target = full if full.is_dir() or weights else root / f"tiny-{key}-tokenizer"
    if target.is_dir():
        return target
    return build_folder_atomically(target, lambda tmp: build_tiny_model(tmp, seed=seed, weights=weights))
