"""The examples' workspace scorers paid for a superset of every task's answer, made without reading
the task. ``examples/shell_agent/check.py`` passed a task when the asked file or folder existed (and,
for "containing the word X", when X was among the file's words): one fixed command run in the
sandbox — every file and folder any task names, each file holding every task word and every number —
earned 1.0 on all 460 tasks. ``examples/assistant/check.py`` paid the share of constraints met: empty
files under every name a task asks for met each task's "file exists" and every empty-file task
whole, half the reward. Both scorers now score 0 a workspace that holds anything the task did not ask
for (dot-entries aside), and the shell example's "containing" a file that names another task word or
number. The controls: each shortcut workspace really holds what every task's constraints check (the
old verdicts), and the honest answer to every task still scores 1.0."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import shlex
import sys
from pathlib import Path
from types import ModuleType

import pytest
from tests.sandbox.sandboxed import run_sandboxed

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SHELL, ASSISTANT = EXAMPLES / "shell_agent", EXAMPLES / "assistant"


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"redteam_{path.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tasks(example: Path) -> list[dict]:
    return [
        json.loads(line)
        for split in ("train", "heldout")
        for line in (example / "tasks" / f"{split}.jsonl").open()
    ]


def in_sandbox(tmp_path: Path, script: str) -> Path:
    """Run ``script`` with bash in a real sandbox over a fresh workspace, as the agent's commands run."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    done = run_sandboxed(tmp_path, ["/bin/bash", "-c", script], {"PATH": "/usr/bin:/bin"}, workspace)
    assert done.returncode == 0, done.stderr[-2000:]
    return workspace


def verdict(check: ModuleType, task: dict, workspace: Path, task_file: Path, monkeypatch) -> dict:
    """The example's scorer run as the command evaluator runs it: its ``main`` with the task file and
    the workspace in the environment; the one JSON line it prints."""
    task_file.write_text(json.dumps(task))
    monkeypatch.setenv("HARNESSRL_TASK_FILE", str(task_file))
    monkeypatch.setenv("HARNESSRL_WORKSPACE", str(workspace))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert check.main() == 0
    return json.loads(out.getvalue())


def test_one_command_that_makes_every_answer_earns_nothing_on_the_shell_agent_example(tmp_path, monkeypatch):
    check, generator, all_tasks = load(SHELL / "check.py"), load(SHELL / "make_tasks.py"), tasks(SHELL)
    # The names and words a policy sees across the tasks (make_tasks.py's lists): one command for all.
    everything = " ".join([*generator.WORDS, *map(str, range(0, 1000))])
    names = [stem + ext for stem in generator.STEMS for ext in generator.EXTENSIONS]
    script = (
        f"w={shlex.quote(everything)}; for d in . {' '.join(generator.DIRS)}; do mkdir -p $d; "
        f'for f in {" ".join(names)}; do echo "$w" > $d/$f; done; done'
    )
    workspace = in_sandbox(tmp_path, script)
    # Control: what every task's check looks for is really there (the old verdict: 1.0 on all 460).
    for task in all_tasks:
        asked = task["hidden"]["check"]
        target = workspace / asked["path"]
        assert target.is_dir() if asked["kind"] == "dir" else target.is_file(), asked
        if asked["kind"] == "contains":
            assert asked["value"] in re.findall(r"[A-Za-z0-9]+", target.read_text().lower()), asked
    rewards = [verdict(check, t, workspace, tmp_path / "task.json", monkeypatch) for t in all_tasks]
    assert len(rewards) == 460 and all(r["reward"] == 0.0 for r in rewards), rewards[:3]
    why = ("more than the task asked for", "a list of guesses")
    assert all(any(w in r["detail"] for w in why) for r in rewards), rewards[:3]

    # Reading only the file's name and listing every answer in it earns nothing either.
    dumps = [t for t in all_tasks if t["hidden"]["check"]["kind"] == "contains"][:20]
    for i, task in enumerate(dumps):
        one = tmp_path / f"dump-{i}"
        one.mkdir()
        (one / task["hidden"]["check"]["path"]).write_text(everything + "\n")
        result = verdict(check, task, one, tmp_path / "task.json", monkeypatch)
        assert result["reward"] == 0.0 and "a list of guesses" in result["detail"], result

    assert set(generator.WORDS) == check.ANSWER_WORDS  # the scorer knows every word a task asks for

    # Control: the honest answer to every task (and a sentence around the word) scores 1.0.
    for i, task in enumerate(all_tasks):
        asked, honest = task["hidden"]["check"], tmp_path / f"honest-{i}"
        target = honest / asked["path"]
        if asked["kind"] == "dir":
            target.mkdir(parents=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f"The answer is {asked['value']}.\n" if asked["kind"] == "contains" else "")
        (honest / ".bash_history").write_text("ls\n")  # a dot-file is no answer: left aside
        result = verdict(check, task, honest, tmp_path / "task.json", monkeypatch)
        assert result["reward"] == 1.0, (task["problem_statement"], result)


def test_empty_files_under_every_asked_name_earn_nothing_on_the_assistant_example(tmp_path, monkeypatch):
    check, all_tasks = load(ASSISTANT / "check.py"), tasks(ASSISTANT)
    constraints = [c for t in all_tasks for c in t["hidden"]["checks"]]
    folders = sorted({c["path"] for c in constraints if c["kind"] == "dir"})
    files = sorted({c["path"] for c in constraints if c["kind"] != "dir"} - set(folders))
    script = f"mkdir -p {' '.join(map(shlex.quote, folders))} && touch {' '.join(map(shlex.quote, files))}"
    workspace = in_sandbox(tmp_path, script)
    # Control: the constraints themselves pay this workspace half the reward, and some tasks whole.
    shares = [check.score(t["hidden"]["checks"], workspace)[0] for t in all_tasks]
    assert sum(shares) / len(shares) > 0.4 and sum(s == 1.0 for s in shares) > 40
    rewards = [verdict(check, t, workspace, tmp_path / "task.json", monkeypatch) for t in all_tasks]
    assert len(rewards) == 340 and all(r["reward"] == 0.0 for r in rewards), rewards[:3]
    assert all("more than the task asked for" in r["detail"] for r in rewards)

    # Control: the example's expert (which reads only the prompt) scores 1.0 on every task.
    expert = load(ASSISTANT / "expert.py")
    for i, task in enumerate(all_tasks):
        honest = tmp_path / f"honest-{i}"
        for path, content in expert.files_for(task["prompt"]).items():
            (honest / path).parent.mkdir(parents=True, exist_ok=True)
            (honest / path).write_text(content)
        (honest / ".hermes").mkdir()  # a dot-folder is no answer: left aside
        result = verdict(check, task, honest, tmp_path / "task.json", monkeypatch)
        assert result["reward"] == 1.0, (task["prompt"], result)


def test_answers_hidden_in_a_folder_the_scorer_cannot_list_earn_nothing(tmp_path):
    """The scorer runs as the sandbox's user over a copy that keeps each folder's mode: a folder the
    policy made unlistable (``chmod 311``) still lets a path in it be checked, and hid the other
    answers put beside it from the "nothing else" rule. Run here as the scorer runs: in a sandbox."""
    generator = load(SHELL / "make_tasks.py")
    names = [stem + ext for stem in generator.STEMS for ext in generator.EXTENSIONS]
    workspace = in_sandbox(
        tmp_path, f"mkdir images && for f in {' '.join(names)}; do : > images/$f; done && chmod 311 images"
    )
    (workspace / ".check.py").write_bytes((SHELL / "check.py").read_bytes())  # dot-files: left aside
    task = {"hidden": {"check": {"kind": "file_in_dir", "path": "images/record.log"}}}
    (workspace / ".task.json").write_text(json.dumps(task))
    env = {"PATH": "/usr/bin:/bin", "HARNESSRL_TASK_FILE": str(workspace / ".task.json")}
    env["HARNESSRL_WORKSPACE"] = str(workspace)
    (tmp_path / "scorer").mkdir()
    (tmp_path / "probe").mkdir()
    scored = run_sandboxed(tmp_path / "scorer", [sys.executable, ".check.py"], env, workspace)
    assert scored.returncode == 0, scored.stderr[-2000:]
    result = json.loads(scored.stdout)
    assert result["reward"] == 0.0 and "images (unreadable)" in result["detail"], result
    # Control: the sandbox's user can check the asked path but not list the folder.
    probe = (
        "import os, sys; os.stat('images/record.log'); "
        "sys.exit(0 if not os.access('images', os.R_OK) else 'the folder is listable')"
    )
    seen = run_sandboxed(
        tmp_path / "probe", [sys.executable, "-c", probe], {"PATH": "/usr/bin:/bin"}, workspace
    )
    assert seen.returncode == 0, seen.stderr[-2000:]
