"""Task schedule: deterministic groups, every task once per epoch, stable ids for resume; task sources
that would show the harness an answer are refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.errors import ConfigError
from harnessrl.schemas import Task
from harnessrl.trainer.schedule import TaskSchedule, run_id_prefix
from harnessrl.trainer.task_sources import InlineTasks, JsonlTasks


def test_groups_are_deterministic_and_cover_each_epoch():
    tasks = [Task(task_id=f"t{i}") for i in range(5)]
    a, b = TaskSchedule(tasks, 3, seed=7), TaskSchedule(tasks, 3, seed=7)
    plans = [a.group(i) for i in range(10)]
    assert [p.task.task_id for p in plans] == [b.group(i).task.task_id for i in range(10)]
    assert sorted(p.task.task_id for p in plans[:5]) == [f"t{i}" for i in range(5)]
    assert sorted(p.task.task_id for p in plans[5:]) == [f"t{i}" for i in range(5)]
    assert plans[3].rollout_ids == ("g000003-r0", "g000003-r1", "g000003-r2")
    assert [p.task.task_id for p in plans] != [
        TaskSchedule(tasks, 3, seed=8).group(i).task.task_id for i in range(10)
    ]


def test_a_runs_rollout_ids_start_with_its_name_and_its_group_ids_do_not():
    # Rollout ids are unique in a store that holds many runs; group ids are the run's own.
    tasks = [Task(task_id=f"t{i}") for i in range(5)]
    schedule = TaskSchedule(tasks, 2, seed=7, id_prefix=run_id_prefix("math-7b"))
    plan = schedule.group(3)
    assert plan.rollout_ids == ("math-7b-g000003-r0", "math-7b-g000003-r1") and plan.group_id == "g000003"
    evaluation = schedule.evaluation(40, tasks[:2], schedule.sampling)
    assert evaluation.rollout_ids == ("math-7b-eval-s00040-t0000", "math-7b-eval-s00040-t0001")
    assert evaluation.group_id == "eval-s00040" and evaluation.step == 40
    assert TaskSchedule(tasks, 2, seed=7).group(3).rollout_ids == ("g000003-r0", "g000003-r1")  # bare


def test_task_sources_refuse_answers_the_harness_would_see(tmp_path):
    hidden = InlineTasks(type="inline", items=[{"task_id": "a", "prompt": "2+2?", "hidden": {"answer": "4"}}])
    assert hidden.load(split="train")[0].data["hidden"] == {"answer": "4"}
    visible = InlineTasks(type="inline", items=[{"task_id": "a", "prompt": "2+2?", "solution": "4"}])
    with pytest.raises(ConfigError, match="train tasks: task 'a': task field 'solution' is evaluator-only"):
        visible.load(split="train")
    # The prompt reaches the harness: a template cannot pull hidden data into it.
    leaky = InlineTasks(type="inline", items=hidden.items, prompt_template="{prompt} ({hidden[answer]})")
    with pytest.raises(ConfigError, match="prompt_template: the task has no field 'hidden'"):
        leaky.load(split="train")
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt": "2+2?", "answer": "4"}\n')
    with pytest.raises(ConfigError, match=r"t\.jsonl:1: task field 'answer'"):
        JsonlTasks(type="jsonl", path=str(path)).load(split="heldout")


@pytest.mark.parametrize(
    "template",
    ["Solve {", "Solve }", "Solve {0}", "Solve {prompt.x}", "Solve {prompt!z}", "Solve {prompt[x]}"],
)
def test_a_prompt_template_that_cannot_be_filled_is_a_config_error_naming_the_field(template):
    """Regression: a stray brace, a positional field, an attribute or a conversion the value lacks
    raised ValueError/AttributeError/TypeError out of the loader: a traceback, exit 1."""
    source = InlineTasks(type="inline", items=[{"task_id": "a", "prompt": "2+2?"}], prompt_template=template)
    with pytest.raises(
        ConfigError, match=r"^train\.prompt_template: .* cannot be filled with the fields of task 'a'"
    ):
        source.load(split="train")
    # Control: a template of the task's fields, with escaped braces, fills.
    fine = InlineTasks(type="inline", items=source.items, prompt_template="{{Q}} {prompt}")
    assert fine.load(split="train")[0].data["prompt"] == "{Q} 2+2?"


def test_harnessrl_train_refuses_an_unfillable_prompt_template_with_exit_2_and_no_folder(tmp_path):
    config = Path(__file__).resolve().parents[2] / "examples" / "tiny" / "train.toml"
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "harnessrl", "train", str(config), "--run-dir", str(run_dir)]
    done = subprocess.run(
        [*argv, "--set", "tasks.prompt_template='Solve {'"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "tasks.prompt_template: 'Solve {' cannot be filled" in done.stderr
    assert "Traceback" not in done.stderr and not run_dir.exists()
