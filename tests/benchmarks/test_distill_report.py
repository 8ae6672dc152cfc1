"""The report helpers of ``benchmarks/distill_learning.py``: the paired gain between two evaluations
of the same held-out tasks, and the picture; the benchmark itself is run by hand, never as a test."""

from __future__ import annotations

import json
import math
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import pytest
from tests.benchmarks.scripts import load_benchmark
from tests.fakes.skilled_agent import skilled_agent


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


def test_an_evaluation_with_several_samples_a_task_reports_the_mean_task_success(dl, tmp_path):
    # --sampled-evals: a 3/4, b 1/4 (c's 0.5 is partial, not solved): success 0.5 over 2 tasks.
    rows = [("a", "f", 1), ("a", "f", 1), ("a", "f", 0), ("a", "f", 1), ("b", "g", 0), ("b", "g", 0.5)]
    rows += [("b", "g", 1), ("b", "g", 0)]
    (tmp_path / "rewards.json").write_text(
        json.dumps([{"task_id": t, "family": f, "reward": r, "outcome": "finished"} for t, f, r in rows])
    )
    report = dl.evaluation_report(tmp_path, 4)
    assert (report["success"], report["solved"], report["tasks"], report["samples_per_task"]) == (
        0.5,
        4,
        2,
        4,
    )
    assert report["se"] == round(math.sqrt(((0.75 - 0.5) ** 2 + (0.25 - 0.5) ** 2) / 2 / 2), 3)
    assert report["by_family"] == {"f": 0.75, "g": 0.25}
    assert report["mean_reward"] == round(4.5 / 8, 3)


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


AGENT = skilled_agent("family")  # solves the first task["family"] samples of its task


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")
def test_rl_trains_on_the_tasks_the_sft_model_solves_sometimes(dl, tmp_path):
    """``--rl-select``: each candidate calibrated k times through the example's train.toml (the real
    rollout stack, sampled as RL samples), and RL's task file holds exactly the tasks with mixed
    outcomes, as the example wrote them."""
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "script.json").write_text(json.dumps({"turns": [{"content": "Answer: 42"}]}))
    (tmp_path / "train.toml").write_text(
        """
[engine]
model = "tiny"                 # the SFT checkpoint's place: select_rl_tasks sets engine.model

[harness]
preset = "python"
command = ["./agent.py", "{prompt}"]
timeout_s = 60

[evaluator]
type = "exact_match"
field = "hidden.answer"
pattern = 'Answer:\\s*(-?[0-9.]+)'
source = "stdout"

[controller]
concurrency = 4
max_infra_retries = 0
poll_interval_s = 0.2

[trainer]
temperature = 0.7
max_tokens = 64
"""
    )
    example = dl.Example(tmp_path, "train.jsonl", "heldout.jsonl", "family", "python", "none", "x")
    solves = [0, 2, 4, 1, 3]  # of k = 4: tasks 1, 3 and 4 are mixed
    candidates = [
        {"task_id": f"train-{i}", "prompt": f"Task {i}: reply.", "family": str(n), "hidden": {"answer": "42"}}
        for i, n in enumerate(solves)
    ]
    work = tmp_path / "work"
    work.mkdir()
    report = dl.select_rl_tasks(example, candidates, work, f"scripted:{tmp_path / 'script.json'}", 4, [])
    assert {k: report[k] for k in ("candidates", "k", "rollouts", "mixed", "never_solved", "always_solved")} == {
        "candidates": 5, "k": 4, "rollouts": 20, "mixed": 3, "never_solved": 1, "always_solved": 1,
    }  # fmt: skip
    assert report["pass_rate"] == pytest.approx(sum(solves) / 20)
    assert report["mixed_by_family"] == {"1": 1, "2": 1, "3": 1}
    assert dl.read_jsonl(Path(report["tasks_file"])) == [candidates[1], candidates[3], candidates[4]]
