"""The shell_agent example's scorer: checks the workspace against the task's hidden ``check``.

Run by harnessrl's ``command`` evaluator in a fresh sandbox over a copy of the workspace (the agent's
sandbox is gone by then). Reads the full task (``HARNESSRL_TASK_FILE``, hidden fields included) and
the workspace (``HARNESSRL_WORKSPACE``); prints one JSON line ``{"reward": 0 or 1, "detail": ...}``.
A symlink never counts as the file or directory asked for: the agent must create the thing itself.
"""

import json
import os
import re
import sys
from pathlib import Path

_WORD = re.compile(r"[A-Za-z0-9]+")


def _regular_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _real_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _words(path: Path) -> list[str]:
    with path.open("rb") as f:  # a huge file is the agent's problem, not the scorer's memory
        text = f.read(1 << 16).decode("utf-8", "replace")
    return [w.lower() for w in _WORD.findall(text)]


def score(check: dict, workspace: Path) -> tuple[bool, str]:
    """(passed, why) for one check; the kinds are the ones make_tasks.py writes."""
    kind = check["kind"]
    target = workspace / check["path"]
    if ".." in Path(check["path"]).parts:
        raise ValueError(f"check path {check['path']!r} leaves the workspace")
    if kind == "dir":
        ok = _real_dir(target)
        return ok, f"{check['path']} {'is' if ok else 'is not'} a directory"
    if kind == "file_in_dir":
        ok = _real_dir(target.parent) and _regular_file(target)
        return ok, f"{check['path']} {'exists' if ok else 'does not exist'}"
    if not _regular_file(target):
        return False, f"no regular file {check['path']}"
    if kind == "file":
        return True, f"{check['path']} exists"
    if kind == "contains":
        found = check["value"].lower() in _words(target)
        return found, f"{check['path']} {'contains' if found else 'lacks'} {check['value']!r}"
    raise ValueError(f"unknown check kind {kind!r}")


def main() -> int:
    task = json.loads(Path(os.environ["HARNESSRL_TASK_FILE"]).read_text())
    workspace = Path(os.environ["HARNESSRL_WORKSPACE"])
    passed, detail = score(task["hidden"]["check"], workspace)
    print(json.dumps({"reward": 1.0 if passed else 0.0, "detail": detail}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
