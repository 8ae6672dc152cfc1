"""docs/sft.md names every field of the SFT config's own sections and every metric an SFT step writes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from harnessrl.sft.config import SelectSection, SftSection, SourceSection

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "sft.md").read_text()


def test_every_sft_config_field_is_documented():
    named = set(re.findall(r"`([\w.]+)`", PAGE))
    missing = [
        f"{section}.{field}"
        for section, model in (("sft", SftSection), ("select", SelectSection), ("source", SourceSection))
        for field in model.model_fields
        if field not in named and f"{section}.{field}" not in named
    ]
    assert not missing, f"docs/sft.md does not document {missing}"


def test_every_sft_metric_is_documented():
    written = set()
    for module in ("step.py", "run.py"):
        tree = ast.parse((ROOT / "src" / "harnessrl" / "sft" / module).read_text())
        written |= {
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith("sft/")
        }
    rows = {
        name
        for line in PAGE.splitlines()
        if line.startswith("| `")
        for name in re.findall(r"`(sft/\w+)`", line)
    }
    assert written and written <= rows, f"undocumented: {sorted(written - rows)}"
