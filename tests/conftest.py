"""Test-session settings shared by every test folder.

Built and converted models (the tiny model, SmolLM2 converted from its GGUF) go to the checkout's
own ``.cache/harnessrl`` instead of ``~/.cache``, so the suite behaves the same on a fresh machine
as on a developer's (the first run builds them; later runs reuse them). Subprocesses inherit it.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault(
    "HARNESSRL_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".cache" / "harnessrl")
)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
