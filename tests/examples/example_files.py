"""Helpers the example tests share: load an example's script as a module, run its task generator,
read JSON Lines, and run one scripted rollout through the example's ``rollout.toml``."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

HARNESSRL = [sys.executable, "-m", "harnessrl"]


def load_script(example: Path, name: str) -> ModuleType:
    """``examples/<example>/<name>.py`` imported as a module (examples are not a package)."""
    spec = importlib.util.spec_from_file_location(f"{example.name}_{name}", example / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_tasks(example: Path, out: Path, *extra: str) -> dict:
    """Run the example's ``make_tasks.py --out OUT``; its last stdout line (a JSON report)."""
    proc = subprocess.run(
        [sys.executable, str(example / "make_tasks.py"), "--out", str(out), *extra],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def scripted_rollout(example: Path, tmp_path: Path, name: str, turns: list, task: dict, *sets: str) -> dict:
    """One ``harnessrl rollout`` with the example's ``rollout.toml`` and a scripted policy playing
    ``turns``; ``sets`` are more ``--set`` overrides. Its summary (the last stdout line)."""
    script = tmp_path / f"{name}.json"
    script.write_text(json.dumps({"turns": turns, "on_exhausted": "repeat_last"}))
    task_file = tmp_path / f"{name}-task.json"
    task_file.write_text(json.dumps(task))
    argv = [*HARNESSRL, "rollout", "--config", str(example / "rollout.toml"), "--task", f"@{task_file}"]
    argv += ["--run-dir", str(tmp_path / f"run-{name}"), "--set", f"engine.model=scripted:{script}"]
    for item in sets:
        argv += ["--set", item]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
