"""The search tasks' user-written inputs named, never a traceback: a question file whose
``reward_model`` is not an object, a misspelt ``score_search`` kwarg (through the real ``harnessrl
rollout`` command), and a dataset ``--out`` that cannot be written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.errors import ConfigError
from harnessrl.tasks.search import main as dataset_main
from harnessrl.trainer.task_sources import parse_task_source


@pytest.mark.parametrize(
    "reward_model",
    ["exact match", ["a"], {"ground_truth": "Velmora"}, {"ground_truth": ["Velmora"]}],
    ids=["string", "list", "ground-truth-string", "ground-truth-list"],
)
def test_a_reward_model_that_is_no_object_is_the_rows_named_error(
    tmp_path: Path, reward_model: object
) -> None:
    # ``.get`` on a string or a list: an AttributeError's traceback from the searchqa source.
    path = tmp_path / "qa.jsonl"
    good = {"id": "ok", "question": "q?", "reward_model": {"ground_truth": {"target": ["Velmora"]}}}
    bad = {"id": "bad", "question": "q?", "reward_model": reward_model}
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    source = parse_task_source({"type": "searchqa", "path": str(path)})
    with pytest.raises(ConfigError, match=r"qa\.jsonl:2: needs gold answers"):
        source.load(split="train")
    path.write_text(json.dumps(good) + "\n")  # control: the Search-R1 layout itself is read
    [task] = source.load(split="train")
    assert task.data["hidden"]["answers"] == ["Velmora"]


def _rollout(tmp_path: Path, kwargs: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"content": "unused"}]}))
    config = tmp_path / "rollout.toml"
    config.write_text(
        f'[engine]\nmodel = "scripted:{script}"\n\n'
        '[harness]\npreset = "python"\ncommand = ["/bin/true"]\nsandbox = "none"\n\n'
        '[evaluator]\ntype = "python"\nfunction = "harnessrl.tasks.search:score_search"\n'
        f"kwargs = {kwargs}\n"
    )
    task = {"prompt": "q?", "hidden": {"answers": ["Velmora"]}}
    return subprocess.run(
        [sys.executable, "-m", "harnessrl", "rollout", "--config", str(config), "--task", json.dumps(task)]
        + ["--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_misspelt_score_search_kwarg_is_exit_2_naming_it(tmp_path: Path) -> None:
    # The task check passed the kwargs on as they were: a TypeError's traceback, exit 1.
    refused = _rollout(tmp_path, '{ source = "file", metirc = "f1" }')
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "Traceback" not in refused.stderr
    assert "evaluator.kwargs" in refused.stderr and "metirc" in refused.stderr
    # Control: the same command with a known but wrong value is named the same way.
    wrong_value = _rollout(tmp_path, '{ source = "file", metric = "f2" }')
    assert wrong_value.returncode == 2 and "evaluator.kwargs.metric" in wrong_value.stderr


@pytest.mark.parametrize("where", ["a-file", "a-file/under-it"])
def test_a_dataset_out_that_cannot_be_written_is_exit_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    (tmp_path / "a-file").write_text("not a folder\n")
    with pytest.raises(SystemExit) as exit_:
        dataset_main(["--out", str(tmp_path / where), "--train", "5", "--heldout", "5"])
    assert exit_.value.code == 2
    assert "--out" in capsys.readouterr().err
