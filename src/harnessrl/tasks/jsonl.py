"""Tasks as JSON Lines: one task per line, loaded for a run and saved for the next.

A line is either a full ``Task`` record (``{"task_id": ..., "split": ..., "data": {...}}``) or just
the task's data (``{"prompt": ..., "hidden": {"answer": ...}}``), which gets ``task_id`` from its own
``task_id``/``id`` field (a string or an integer, never empty) or ``<file stem>-<line number>``.
Errors name the file and line.

The harness sees every top-level field of a task's data; a line with an evaluator-only name at top
level (``answer``, ``solution``, ``gold_patch``... ``harnessrl.tasks.fields.EVALUATOR_ONLY``) is
refused: such data belongs under ``hidden``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError

from harnessrl.errors import ConfigError
from harnessrl.input_files import read_regular
from harnessrl.schemas import Task
from harnessrl.tasks.fields import check_visible

_RECORD_KEYS = frozenset(Task.model_fields)
# What no store can keep in an id (harnessrl.store.codecs refuses it): NUL and lone surrogates.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def load_tasks(path: str | Path, *, split: str | None = None) -> list[Task]:
    """All tasks in ``path``; ``split`` overrides each task's split when given."""
    path = Path(path)
    try:
        # "\n" only: str.splitlines also splits at U+2028, U+2029, U+0085..., which save_tasks
        # writes raw inside strings (ensure_ascii=False); "\r\n" made one "\n" as read_text did.
        # Only a regular file: a FIFO given as the tasks held the start forever.
        text = read_regular(path).decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"tasks: cannot read {path}: {exc}") from exc
    tasks: list[Task] = []
    seen: set[str] = set()
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"tasks: {where}: not valid JSON: {exc}") from exc
        except RecursionError:  # [[[[...: json's decoder recurses once per level
            raise ConfigError(f"tasks: {where}: nested too deeply to read") from None
        if not isinstance(obj, dict):
            raise ConfigError(f"tasks: {where}: expected a JSON object, got {type(obj).__name__}")
        try:
            if "task_id" in obj and isinstance(obj.get("data"), dict) and set(obj) <= _RECORD_KEYS:
                task = Task.model_validate(obj)
            else:  # bare task data
                task = Task(task_id=_bare_task_id(obj, where, f"{path.stem}-{lineno}"), data=obj)
        except ValidationError as exc:  # a full record's field: name it ("Input should be..." alone did not)
            error = exc.errors()[0]
            name = ".".join(str(part) for part in error["loc"]) or "the record"
            raise ConfigError(
                f"tasks: {where}: {name!r}: {error['msg']}, got {json.dumps(error.get('input'))[:60]}"
            ) from exc
        if not task.task_id.strip():
            raise ConfigError(f"tasks: {where}: 'task_id' is empty; give the task an id or leave it out")
        for name, value in (("task_id", task.task_id), ("split", task.split)):
            if _UNSTORABLE.search(value):  # every store refuses it, only once the run is under way
                raise ConfigError(
                    f"tasks: {where}: {name!r} must not contain NUL or lone surrogate characters, "
                    f"got {value[:60]!r}"
                )
        check_visible(task.data, where=f"tasks: {where}")
        if split is not None:
            task = task.model_copy(update={"split": split})
        if task.task_id in seen:
            raise ConfigError(f"tasks: {where}: duplicate task_id {task.task_id!r}")
        seen.add(task.task_id)
        tasks.append(task)
    return tasks


def _bare_task_id(obj: dict, where: str, default: str) -> str:
    """A bare line's ``task_id`` (or ``id``): a string or an integer; ``None``, a list or an object
    became the id ``"None"`` or its Python repr."""
    name = "task_id" if "task_id" in obj else "id" if "id" in obj else None
    if name is None:
        return default
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ConfigError(
            f"tasks: {where}: {name!r} must be a string or an integer, got {json.dumps(value)[:60]}"
        )
    return str(value)


def save_tasks(path: str | Path, tasks: Iterable[Task]) -> Path:
    """Write ``tasks`` as full records, atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for task in tasks:
            fh.write(json.dumps(task.model_dump(mode="json"), ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path
