"""Shared model folders for engine and tokenizer tests (built or converted once, in the user cache)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    from harnessrl.engines.tiny import tiny_model_dir

    return tiny_model_dir()


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    from harnessrl.engines.models import resolve_model_dir

    try:
        return resolve_model_dir("smollm2")
    except Exception as exc:  # the package is optional
        pytest.skip(f"SmolLM2 unavailable: {exc}")
