"""Tasks as JSON Lines: round trip, bare data lines, errors that name the line, and the refusal of
tasks that would show the harness their answer."""

from __future__ import annotations

import os

import pytest

from harnessrl.errors import ConfigError
from harnessrl.schemas import Task
from harnessrl.tasks import load_tasks, save_tasks


def test_round_trip(tmp_path):
    tasks = [
        Task(task_id="a", data={"prompt": "hi", "hidden": {"answer": 1}}),
        Task(task_id="b", split="eval", data={}),
    ]
    path = save_tasks(tmp_path / "sub" / "tasks.jsonl", tasks)
    assert load_tasks(path) == tasks
    assert [t.split for t in load_tasks(path, split="test")] == ["test", "test"]
    assert not list(path.parent.glob(".*.tmp"))


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085"])
def test_strings_may_hold_what_splitlines_splits_at(tmp_path, separator):
    """``save_tasks`` writes these raw (ensure_ascii=False); only "\n" ends a line."""
    tasks = [
        Task(task_id="a", data={"prompt": f"one{separator}two", "hidden": {"answer": f"x{separator}"}}),
        Task(task_id="b", data={"prompt": "three"}),
    ]
    path = save_tasks(tmp_path / "tasks.jsonl", tasks)
    assert separator in path.read_text(encoding="utf-8")
    assert load_tasks(path) == tasks
    bare = tmp_path / "bare.jsonl"
    bare.write_text(f'{{"prompt": "a{separator}b"}}\r\n{{"prompt": "c"}}\r\n', encoding="utf-8")
    assert [(t.task_id, t.data["prompt"]) for t in load_tasks(bare)] == [
        ("bare-1", f"a{separator}b"),
        ("bare-2", "c"),
    ]


def test_bare_data_lines(tmp_path):
    path = tmp_path / "math.jsonl"
    path.write_text(
        '{"prompt": "1+1", "hidden": {"answer": "2"}}\n\n{"id": 7, "prompt": "2+2"}\n{"task_id": "x", "data": 3}\n'
    )
    tasks = load_tasks(path)
    assert [t.task_id for t in tasks] == ["math-1", "7", "x"]
    assert tasks[0].data == {"prompt": "1+1", "hidden": {"answer": "2"}}
    assert tasks[2].data == {"task_id": "x", "data": 3}  # not a record (data is not an object): bare data


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"prompt": "a"}\n{oops\n', r"tasks\.jsonl:2: not valid JSON"),
        ("[1, 2]\n", r"tasks\.jsonl:1: expected a JSON object"),
        ('{"task_id": "a"}\n{"task_id": "a"}\n', r"tasks\.jsonl:2: duplicate task_id 'a'"),
        ('{"task_id": "a", "data": {}, "split": 3}\n', r"tasks\.jsonl:1"),
        # Evaluator-only data at top level would reach the harness (HARNESSRL_TASK, task.json).
        (
            '{"prompt": "1+1"}\n{"prompt": "1+1", "answer": "2"}\n',
            r"tasks\.jsonl:2: task field 'answer' is evaluator-only.*under 'hidden'.*'hidden\.answer'",
        ),
        ('{"task_id": "a", "data": {"gold_patch": "diff"}}\n', r"tasks\.jsonl:1: task field 'gold_patch'"),
        ('{"prompt": "p", "hidden": "42"}\n', r"tasks\.jsonl:1: task field 'hidden' must be a JSON object"),
        # A traceback (RecursionError) before, not an error naming the line.
        ('{"prompt": "a"}\n' + "[" * 100_000 + "\n", r"tasks\.jsonl:2: nested too deeply to read"),
        # Ids "None", "" and "{'a': 1}" before.
        ('{"task_id": null, "prompt": "p"}\n', r"tasks\.jsonl:1: 'task_id' must be a string or an integer"),
        ('{"id": {"a": 1}, "prompt": "p"}\n', r"tasks\.jsonl:1: 'id' must be a string or an integer"),
        ('{"id": " ", "prompt": "p"}\n', r"tasks\.jsonl:1: 'task_id' is empty"),
        ('{"task_id": "", "data": {}}\n', r"tasks\.jsonl:1: 'task_id' is empty"),
    ],
)
def test_errors_name_the_line(tmp_path, content, message):
    path = tmp_path / "tasks.jsonl"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_tasks(path)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_tasks(tmp_path / "nope.jsonl")


@pytest.mark.timeout(60)  # the bug was a hang: fail, do not wait 10 minutes
def test_a_task_file_that_is_not_a_regular_file_is_refused_not_waited_on(tmp_path):
    # A FIFO given as the tasks held the start forever, waiting for a writer.
    fifo = tmp_path / "tasks.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"tasks: cannot read .*tasks\.jsonl.*not a regular file"):
        load_tasks(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_tasks("/dev/zero")  # a device was read without end
    regular = tmp_path / "crlf.jsonl"  # control: Windows and old Mac line ends, as read_text read them
    regular.write_bytes(
        b'{"task_id": "a", "data": {}}\r\n{"task_id": "b", "data": {}}\r{"task_id": "c", "data": {}}'
    )
    assert [t.task_id for t in load_tasks(regular)] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        # "tasks.jsonl:1: Input should be a valid string" before: which field?
        (
            '{"task_id": "a", "split": 5, "data": {}}\n',
            r"tasks\.jsonl:1: 'split': Input should be a valid string, got 5",
        ),
        ('{"task_id": "a", "split": null, "data": {}}\n', r"tasks\.jsonl:1: 'split': .*got null"),
        ('{"task_id": ["x"], "data": {}}\n', r"tasks\.jsonl:1: 'task_id': .*got \[\"x\"\]"),
        # Loaded before; every store refuses such an id, once the run is under way.
        ('{"task_id": "a\\u0000b", "data": {}}\n', r"tasks\.jsonl:1: 'task_id' must not contain NUL"),
        (
            '{"prompt": "p", "id": "x\\ud800"}\n',
            r"tasks\.jsonl:1: 'task_id' must not contain NUL or lone surrogate",
        ),
        (
            '{"task_id": "a", "split": "tr\\u0000ain", "data": {}}\n',
            r"tasks\.jsonl:1: 'split' must not contain NUL",
        ),
    ],
)
def test_a_bad_record_field_is_named(tmp_path, content, message):
    path = tmp_path / "tasks.jsonl"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_tasks(path)
    path.write_text('{"task_id": "a", "split": "heldout", "data": {"prompt": "p\\u0000"}}\n')  # control
    assert [(t.task_id, t.split, t.data) for t in load_tasks(path)] == [("a", "heldout", {"prompt": "p\0"})]
