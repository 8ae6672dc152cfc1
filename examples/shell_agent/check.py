"""The shell_agent example's scorer: checks the workspace against the task's hidden ``check``.

Run by harnessrl's ``command`` evaluator in a fresh sandbox over a copy of the workspace (the agent's
sandbox is gone by then). Reads the full task (``HARNESSRL_TASK_FILE``, hidden fields included) and
the workspace (``HARNESSRL_WORKSPACE``); prints one JSON line ``{"reward": 0 or 1, "detail": ...}``.
A symlink never counts as the file or directory asked for: the agent must create the thing itself.

Only the thing asked for counts, not a superset of every task's answer: the workspace must hold
nothing else (dot-entries aside), and a file "containing the word X" may name no other word or number
a task asks for. One fixed command that makes every file and folder any task names, each holding
every task word and every number, earned 1 on all 460 tasks without reading one
(tests/redteam/test_example_scorer_shortcuts.py).
"""

import json
import os
import re
import sys
from pathlib import Path

_WORD = re.compile(r"[A-Za-z0-9]+")
#: The words "containing the word X" tasks ask for: make_tasks.py's WORDS (a test keeps them equal).
#: A file holding one of them, or a number, besides the asked one lists guesses, not the answer.
ANSWER_WORDS = frozenset(
    [
        "apple",
        "banana",
        "cherry",
        "river",
        "mountain",
        "garden",
        "rocket",
        "planet",
        "silver",
        "orange",
        "window",
        "pencil",
        "forest",
        "castle",
        "dragon",
        "yellow",
        "purple",
        "winter",
        "summer",
        "tiger",
        "lemon",
        "cloud",
        "stone",
        "bridge",
        "candle",
        "piano",
        "violet",
        "ocean",
    ]
)
_LISTED = 5  # extra entries or other answers named in a detail


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
        value, words = check["value"].lower(), _words(target)
        if value not in words:
            return False, f"{check['path']} lacks {check['value']!r}"
        others = sorted({w for w in words if w != value and (w.isdigit() or w in ANSWER_WORDS)})
        if others:
            return False, f"{check['path']} also names {', '.join(others[:_LISTED])}: a list of guesses"
        return True, f"{check['path']} contains {check['value']!r}"
    raise ValueError(f"unknown check kind {kind!r}")


def extras(check: dict, workspace: Path) -> list[str]:
    """What the workspace holds besides the asked path and its folders (the first few, sorted).
    Entries whose name starts with a dot are left aside: no task asks for one."""
    asked = Path(check["path"])
    allowed = {asked, *asked.parents} - {Path(".")}
    found: list[str] = []

    def unlisted(error: OSError) -> None:  # a folder it cannot list (chmod -r) hides what is in it
        found.append(f"{Path(error.filename).relative_to(workspace)} (unreadable)")

    for folder, dirs, files in os.walk(workspace, onerror=unlisted):  # symlinked folders: listed, not entered
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in [*dirs, *sorted(f for f in files if not f.startswith("."))]:
            relative = Path(folder, name).relative_to(workspace)
            if relative not in allowed:
                found.append(str(relative))
                if len(found) >= _LISTED:
                    return found
    return found


def main() -> int:
    task = json.loads(Path(os.environ["HARNESSRL_TASK_FILE"]).read_text())
    workspace = Path(os.environ["HARNESSRL_WORKSPACE"])
    check = task["hidden"]["check"]
    passed, detail = score(check, workspace)
    extra = extras(check, workspace)
    if passed and extra:
        passed, detail = False, f"the workspace holds more than the task asked for: {', '.join(extra)}"
    print(json.dumps({"reward": 1.0 if passed else 0.0, "detail": detail}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
