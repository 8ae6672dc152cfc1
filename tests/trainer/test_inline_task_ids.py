"""Two tasks under one ``task_id`` in a run's task source are refused before anything starts, naming
the field, whether the tasks are a JSONL file or written inline in the config: the JSONL loader
refused them, but ``type = "inline"`` items took any id, the same one twice included (and an empty
one, or a table's Python repr as the id)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tests.cli.cli_support import TINY, invoke, listing, refused


@pytest.fixture
def project(tmp_path: Path) -> Path:
    shutil.copy(TINY, tmp_path / "train.toml")
    shutil.copy(TINY.parent / "agent.py", tmp_path / "agent.py")
    rows = [{"task_id": "t0", "prompt": "Say a."}, {"task_id": "t0", "prompt": "Say e."}]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return tmp_path


@pytest.mark.parametrize(
    ("source", "named"),
    [
        ('tasks={type="jsonl", path="tasks.jsonl"}', "tasks.jsonl:2: duplicate task_id 't0'"),
        (
            'tasks={type="inline", items=[{task_id="d0", prompt="a"}, {task_id="d0", prompt="e"}]}',
            "tasks.items[1].task_id: duplicate task_id 'd0' (items[0] has it too)",
        ),
        (  # an integer id is the same id as its string
            'heldout={type="inline", items=[{task_id=7, prompt="a"}, {task_id="7", prompt="e"}]}',
            "heldout.items[1].task_id: duplicate task_id '7'",
        ),
        (  # the default id of item 1 is inline-1
            'tasks={type="inline", items=[{task_id="inline-1", prompt="a"}, {prompt="e"}]}',
            "tasks.items[1].task_id: duplicate task_id 'inline-1'",
        ),
        ('tasks={type="inline", items=[{task_id="", prompt="a"}]}', "tasks.items[0].task_id: a non-empty"),
        ('tasks={type="inline", items=[{task_id={a=1}, prompt="a"}]}', "tasks.items[0].task_id: a non-empty"),
        (
            'tasks={type="inline", items=[{task_id="a\\u0000b", prompt="a"}]}',
            "tasks.items[0].task_id: must not",
        ),
    ],
)
def test_tasks_under_one_id_are_refused_naming_the_field(project: Path, source: str, named: str) -> None:
    before = listing(project)
    refused(invoke("train", str(project / "train.toml"), "--set", "trainer.steps=1", "--set", source), named)
    assert listing(project) == before  # no run folder


def test_inline_tasks_with_distinct_ids_load(project: Path) -> None:
    from harnessrl.trainer.task_sources import parse_task_source

    source = parse_task_source({"type": "inline", "items": [{"task_id": 7, "prompt": "a"}, {"prompt": "e"}]})
    assert [task.task_id for task in source.load(split="train")] == ["7", "inline-1"]
