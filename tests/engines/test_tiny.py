"""The tiny model build: deterministic, torch-free, cached safely, loadable by transformers."""

from __future__ import annotations

import hashlib
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harnessrl.engines.tiny import build_tiny_model, tiny_model_dir
from harnessrl.tokenizer import PolicyTokenizer


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_build_is_deterministic_per_seed(tmp_path: Path) -> None:
    a = _digests(build_tiny_model(tmp_path / "a", seed=0))
    b = _digests(build_tiny_model(tmp_path / "b", seed=0))
    c = _digests(build_tiny_model(tmp_path / "c", seed=1))
    assert a == b
    assert set(a) >= {"config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
    assert a["model.safetensors"] != c["model.safetensors"]


def test_concurrent_builders_share_one_cache_folder(tmp_path: Path) -> None:
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: tiny_model_dir(tmp_path), range(4)))
    assert len(set(paths)) == 1
    assert [p.name for p in tmp_path.iterdir()] == [paths[0].name]  # no temporary folders left behind
    assert PolicyTokenizer.from_dir(paths[0]).vocab_size == 4096


def test_tokenizer_only_build_needs_no_torch_or_numpy(tmp_path: Path) -> None:
    import subprocess

    code = (
        "import sys\n"
        "from harnessrl.engines.tiny import tiny_model_dir\n"
        f"p = tiny_model_dir({str(tmp_path)!r}, weights=False)\n"
        "assert (p / 'tokenizer.json').is_file() and not (p / 'model.safetensors').exists()\n"
        "bad = [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_transformers_loads_the_tiny_model(tiny_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    model, info = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_dir), output_loading_info=True)
    assert model.config.model_type == "qwen3"
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_dir))
    assert tok.eos_token == tok.pad_token == "<|im_end|>"
