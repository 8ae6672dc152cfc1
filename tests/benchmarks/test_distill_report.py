"""The report helpers of ``benchmarks/distill_learning.py``: the paired gain between two evaluations
of the same held-out tasks, and the picture; the benchmark itself is run by hand, never as a test."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import pytest
from tests.benchmarks.scripts import load_benchmark


@pytest.fixture(scope="module")
def dl() -> ModuleType:
    return load_benchmark("distill_learning")


def write_rewards(work: Path, stage: str, rewards: dict[str, float]) -> None:
    folder = work / f"eval-{stage}"
    folder.mkdir(parents=True)
    rows = [{"task_id": t, "family": "f", "reward": r, "outcome": "finished"} for t, r in rewards.items()]
    (folder / "rewards.json").write_text(json.dumps(rows))


def test_the_paired_gain_counts_each_task_against_itself(dl, tmp_path):
    # 6 tasks: 2 flip to solved, 1 flips back, a partial reward (0.5) is not solved.
    write_rewards(tmp_path, "sft", {"a": 0, "b": 0, "c": 1, "d": 1, "e": 0, "f": 0.5})
    write_rewards(tmp_path, "rl", {"a": 1, "b": 1, "c": 0, "d": 1, "e": 0, "f": 0.5})
    out = dl.paired_gain(tmp_path, "rl", "sft")
    d = [1, 1, -1, 0, 0, 0]
    mean = sum(d) / 6
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / 5 / 6)
    assert out == {"gain": round(mean, 3), "paired_se": round(se, 3), "to_pass": 2, "to_fail": 1}


def test_several_samples_a_task_are_compared_as_that_tasks_success_rate(dl, tmp_path):
    # Two tasks, four samples each: a 1/4 -> 3/4, b 1 -> 1/2.
    for stage, runs in (
        ("sft", {"a": [1, 0, 0, 0], "b": [1, 1, 1, 1]}),
        ("rl", {"a": [1, 1, 0, 1], "b": [0, 1, 0, 1]}),
    ):
        folder = tmp_path / f"eval-{stage}"
        folder.mkdir()
        rows = [{"task_id": t, "reward": r} for t, rs in runs.items() for r in rs]
        (folder / "rewards.json").write_text(json.dumps(rows))
    assert dl.task_success(json.loads((tmp_path / "eval-rl" / "rewards.json").read_text())) == {
        "a": 0.75,
        "b": 0.5,
    }
    out = dl.paired_gain(tmp_path, "rl", "sft")
    d = [0.5, -0.5]
    se = math.sqrt(sum(x**2 for x in d) / 1 / 2)
    assert out == {"gain": 0.0, "paired_se": round(se, 3), "to_pass": 1, "to_fail": 1}


def test_the_picture_has_a_bar_and_a_label_per_stage(dl, tmp_path):
    heldout = {
        k: {"success": v, "se": 0.05, "tasks": 40} for k, v in (("base", 0.0), ("sft", 0.8), ("rl", 0.9))
    }
    result = {"heldout": heldout, "student": "SmolLM2", "harness": "Hermes Agent (hermes -z)"}
    path = tmp_path / "d.svg"
    dl.write_svg(result, path)
    root = ET.parse(path).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    bars = [r for r in root.iter(f"{ns}rect") if r.get("fill") == "#2b5fb4"]
    assert len(bars) == 3
    heights = [float(b.get("height")) for b in bars]
    assert heights[0] == 0 and heights[1] < heights[2]
    texts = [t.text for t in root.iter(f"{ns}text")]
    assert {"0.00", "0.80", "0.90", "base model", "after SFT", "after SFT + RL"} <= set(texts)
