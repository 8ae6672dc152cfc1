"""The assistant example's scorer: the share of the task's constraints the workspace meets.

Run by harnessrl's ``command`` evaluator in a fresh sandbox over a copy of the workspace (the agent's
sandbox is gone by then). Reads the full task (``HARNESSRL_TASK_FILE``, hidden fields included) and
the workspace (``HARNESSRL_WORKSPACE``); prints one JSON line ``{"reward": share met, "detail": ...}``.
A symlink never counts as the file or folder asked for: the assistant must create the thing itself.

A workspace holding anything the task did not ask for (entries whose name starts with a dot aside)
scores 0: empty files under every name any task asks for, and the folders, met every task's "file
exists" constraint and every empty-file task whole — half the reward, without reading the task
(tests/redteam/test_example_scorer_shortcuts.py).
"""

import json
import os
import sys
from pathlib import Path


def _regular_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


_MAX_BYTES = 1 << 16  # far more than any task's file needs


def _lines(path: Path) -> list[str] | None:
    """The file's non-blank lines, stripped; None for a file over ``_MAX_BYTES``, which meets no
    content constraint: only part of it could be read, and the rest may break the constraint (the
    right word, then 64 KiB of blanks, then anything else, is not "nothing else")."""
    with path.open("rb") as f:  # a huge file is the agent's problem, not the scorer's memory
        data = f.read(_MAX_BYTES + 1)
    if len(data) > _MAX_BYTES:
        return None
    text = data.decode("utf-8", "replace")
    return [line.strip() for line in text.splitlines() if line.strip()]


def met(check: dict, workspace: Path) -> bool:
    """Whether one constraint holds; the kinds are the ones make_tasks.py writes."""
    if ".." in Path(check["path"]).parts or Path(check["path"]).is_absolute():
        raise ValueError(f"check path {check['path']!r} leaves the workspace")
    target, kind, value = workspace / check["path"], check["kind"], check.get("value")
    if kind == "dir":
        return target.is_dir() and not target.is_symlink()
    if not _regular_file(target) or (target.parent != workspace and target.parent.is_symlink()):
        return False
    if kind == "file":
        return True
    if kind == "empty_file":
        return target.stat().st_size == 0
    lines = _lines(target)
    if lines is None:
        return False
    if kind == "line_count":
        return len(lines) == value
    if kind == "lines_from":
        return bool(lines) and all(line.lower() in value for line in lines)
    if kind == "lines_exact":
        return lines == value
    if kind == "first_line":
        return bool(lines) and lines[0] == value
    if kind == "bullets":
        bullets = [line[2:].strip().lower() for line in lines if line.startswith("- ")]
        return sorted(bullets) == sorted(value)
    if kind == "exact":
        return lines == [value]
    if kind == "json_key":
        try:
            data = json.loads(target.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            return False
        found = data.get(check["key"]) if isinstance(data, dict) else None
        return type(found) is int and found == value
    raise ValueError(f"unknown check kind {kind!r}")


def extras(checks: list[dict], workspace: Path, listed: int = 5) -> list[str]:
    """What the workspace holds besides the checked paths and their folders (the first ``listed``).
    Entries whose name starts with a dot are left aside: no task asks for one."""
    allowed = {p for c in checks for p in (Path(c["path"]), *Path(c["path"]).parents)} - {Path(".")}
    found: list[str] = []

    def unlisted(error: OSError) -> None:  # a folder it cannot list (chmod -r) hides what is in it
        found.append(f"{Path(error.filename).relative_to(workspace)} (unreadable)")

    for folder, dirs, files in os.walk(workspace, onerror=unlisted):  # symlinked folders: listed, not entered
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in [*dirs, *sorted(f for f in files if not f.startswith("."))]:
            relative = Path(folder, name).relative_to(workspace)
            if relative not in allowed:
                found.append(str(relative))
                if len(found) >= listed:
                    return found
    return found


def score(checks: list[dict], workspace: Path) -> tuple[float, list[str]]:
    """(share of constraints met, the ones missed)."""
    missed = [f"{c['kind']} {c['path']}" for c in checks if not met(c, workspace)]
    return (len(checks) - len(missed)) / len(checks), missed


def main() -> int:
    task = json.loads(Path(os.environ["HARNESSRL_TASK_FILE"]).read_text())
    checks, workspace = task["hidden"]["checks"], Path(os.environ["HARNESSRL_WORKSPACE"])
    reward, missed = score(checks, workspace)
    detail = "all met" if not missed else "missed: " + "; ".join(missed)
    extra = extras(checks, workspace)
    if extra:
        reward, detail = 0.0, f"the workspace holds more than the task asked for: {', '.join(extra)}"
    print(json.dumps({"reward": reward, "detail": detail}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
