"""Numbers the docs quote from ``benchmarks/results/*.json`` are the numbers in those files.

Each had drifted from a rerun committed beside it: merge_rate's table still showed two of the
three trace families (96 rollouts, the old Agent Lightning counts), store_growth's aside the costs
of an earlier run, and docs/scale.md a trainer speed (~170 tokens/s) that trainer_vs_trl.json does
not hold (that is TRL's; harnessrl's is ~500)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
BENCHMARKS = (ROOT / "benchmarks" / "README.md").read_text()


def result(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else len(text)]


def table_after(text: str, marker: str) -> list[list[str]]:
    """The cells of the rows of the first table after ``marker`` (header and rule left out)."""
    rest = text[text.rfind("\n", 0, text.index(marker)) + 1 :]
    if not rest.startswith("|"):  # a marker above the table, not in its header
        rest = rest[rest.index("\n|") + 1 :]
    lines = rest.split("\n\n", 1)[0].splitlines()
    return [[c.strip().strip("*") for c in line.strip().strip("|").split("|")] for line in lines[2:]]


def number(cell: str) -> float:
    return float(re.search(r"-?[0-9][0-9,]*\.?[0-9]*", cell).group(0).replace(",", ""))


def test_merge_rate_table_is_the_committed_result():
    data = result("merge_rate.json")
    families = data["families"]
    rows = table_after(section(BENCHMARKS, "## merge_rate"), "**Latest numbers**")
    shown = {row[0].split()[0]: row for row in rows}
    assert set(shown) == {*families, "combined"}
    for name, family in families.items():
        row = shown[name]
        assert number(row[1]) == family["rollouts"], name
        assert number(row[2]) == round(family["calls_per_rollout"], 2), name
        assert number(row[3]) == round(family["harnessrl"]["samples_per_rollout"], 3), name
        assert number(row[4]) == round(family["agl_rule"]["samples_per_rollout"], 3), name
        assert number(row[5]) == round(family["agl_rule_parsed_arguments"]["samples_per_rollout"], 3), name
    combined = shown["combined"]
    calls = sum(f["calls"] for f in families.values())
    assert number(combined[1]) == data["rollouts"]
    assert number(combined[2]) == round(calls / data["rollouts"], 2)
    assert number(combined[3]) == round(data["harnessrl_samples_per_rollout"], 3)
    assert number(combined[4]) == round(data["agl_rule_samples_per_rollout"], 3)
    assert number(combined[5]) == round(data["agl_rule_parsed_arguments_samples_per_rollout"], 3)


def test_store_growth_table_and_aside_are_the_committed_result():
    data = result("store_growth.json")
    text = section(BENCHMARKS, "## store_growth")
    stored, before = table_after(text, "| | row bytes")
    assert number(stored[1]) == data["stored"]["row_bytes"]
    assert number(stored[2]) == round(data["ratio_to_yardstick"]["stored_rows"], 2)
    assert number(stored[3]) == round(data["ratio_to_yardstick"]["stored_file"], 2)
    assert number(before[1]) == data["before_version3"]["row_bytes"]
    assert number(before[2]) == round(data["ratio_to_yardstick"]["before_rows"], 1)
    assert number(before[3]) == round(data["ratio_to_yardstick"]["before_file"], 1)
    costs = data["aside_costs"]
    aside = re.search(
        r"writing a call ([0-9.]+) vs ([0-9.]+) ms;\s+reading the rollout back ([0-9.]+) vs ([0-9.]+) ms",
        text,
    )
    assert aside is not None
    assert [float(v) for v in aside.groups()] == [
        costs["write_ms_per_call"]["stored"],
        costs["write_ms_per_call"]["before"],
        costs["read_rollout_ms"]["stored"],
        costs["read_rollout_ms"]["before"],
    ]


def test_scale_guide_quotes_the_trainer_speed_trainer_vs_trl_measured():
    data = result("trainer_vs_trl.json")
    bf16 = data["per_dtype"]["bf16"]
    text = " ".join((ROOT / "docs" / "scale.md").read_text().split())
    quoted = re.search(
        r"the trainer does ~([0-9]+) tokens/s with SmolLM2-135M in bf16 autocast, ~([0-9]+) without "
        r"shared-prefix rows \(TRL's `GRPOTrainer`: ~([0-9]+)",
        text,
    )
    assert quoted is not None
    measured = [
        bf16["harnessrl"]["tokens_per_s"],
        bf16["harnessrl_no_shared_prefixes"]["tokens_per_s"],
        bf16["trl"]["tokens_per_s"],
    ]
    for shown, value in zip(map(int, quoted.groups()), measured, strict=True):
        assert abs(shown - value) <= 0.05 * value, (shown, value)
