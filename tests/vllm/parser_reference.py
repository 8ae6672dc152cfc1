"""vLLM's parsers as a reference: one subprocess under vLLM's Python for a whole batch of texts.

``vllm_parse(cases, special_tokens=...)`` returns, per case, what vLLM's server would make of a
sampled text (see ``parser_worker.py`` for the shapes). Importing vLLM costs ~10 s, so a test module
sends all its texts at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.vllm.vllm_support import vllm_python

from harnessrl.engines.tiny import tiny_model_dir

WORKER = Path(__file__).with_name("parser_worker.py")


def vllm_parse(
    cases: Sequence[dict[str, Any]],
    *,
    special_tokens: Sequence[str] = (),
    tokenizer_dir: Path | None = None,
) -> list[dict[str, Any]]:
    """vLLM's reading of each case (``tool_parser``, ``reasoning_parser``, ``text``, ``tools``)."""
    request = {
        "tokenizer_dir": str(tokenizer_dir or tiny_model_dir(weights=False)),
        "special_tokens": list(special_tokens),
        "cases": list(cases),
    }
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with tempfile.TemporaryDirectory() as scratch:
        output = Path(scratch) / "results.json"
        proc = subprocess.run(
            [vllm_python(), str(WORKER), str(output)],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"vLLM parser worker failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        results = json.loads(output.read_text(encoding="utf-8"))
    assert len(results) == len(cases)
    return results
