"""The "Distill, then RL" teacher commands of the search agent's and the assistant's READMEs, run as
written from a fresh copy of the example (no ``runs/`` folder yet), from the folder the README runs
them in (the repository root): the command that makes ``TEACHER_TASKS.jsonl``, then ``harnessrl data
calibrate`` with ``teacher.toml``. Only ``.venv/bin/`` (this interpreter's) and the expert's URL (a
free port here instead of 8765) are changed. Every teacher rollout must earn reward 1 and land in the
store ``sft.toml`` reads (``harnessrl sft --export-jsonl``: the conversations sft would train on).

Before these READMEs were fixed, the calibrate command wrote its records to ``runs/teacher.jsonl`` in
a folder that does not exist in a fresh checkout (a traceback after every rollout had run), and the
assistant's relative ``--run-dir`` made ``check.py`` look for the workspace at the wrong path (every
teacher rollout scored 0, so sft had nothing to train on).

Also: a ``data calibrate`` command in an example config's comments names records calibrate reads, and
the assistant's ``check.py`` does not pass a file whose tail (past the 64 KiB it reads) it never saw.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.examples.example_files import HARNESSRL, load_script, records
from tests.examples.test_assistant import needs_hermes
from tests.examples.test_shell_agent import needs_sandbox

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def readme_commands(example: str) -> list[str]:
    """The commands of the README's code block that runs ``data calibrate``, continuation lines joined
    and trailing comments dropped, with ``.venv/bin/`` pointing at this interpreter's folder."""
    text = (ROOT / "examples" / example / "README.md").read_text()
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", text, re.DOTALL) if "data calibrate" in b]
    assert len(blocks) == 1, blocks
    joined = re.sub(r"\\\n\s*", "", blocks[0])
    commands = [re.sub(r"\s+#[^'\"]*$", "", line).strip() for line in joined.splitlines()]
    return [c.replace(".venv/bin/", f"{VENV_BIN}/") for c in commands if c]


def fresh_checkout(tmp_path: Path, example: str) -> Path:
    """A folder shaped like the repository root for ``example``: the example (no runs/) and the
    shared expert server."""
    root = tmp_path / "repo"
    shutil.copytree(
        ROOT / "examples" / example, root / "examples" / example, ignore=shutil.ignore_patterns("runs")
    )
    shutil.copy(ROOT / "examples" / "expert_server.py", root / "examples" / "expert_server.py")
    return root


def run_readme_teacher(tmp_path: Path, example: str, keep: int) -> tuple[Path, list[dict]]:
    """The README's teacher block from a fresh checkout, its task file cut to its first ``keep``
    tasks; the checkout and the calibrated records."""
    from harnessrl.gateway.server import serve_in_thread

    root = fresh_checkout(tmp_path, example)
    commands = readme_commands(example)
    assert "expert.py --port 8765 &" in commands[0], commands  # served here instead, on a free port
    [calibrate] = [c for c in commands if "data calibrate" in c]
    make_tasks = [c for c in commands if c.endswith("> TEACHER_TASKS.jsonl")]
    if make_tasks:
        made = subprocess.run(
            ["bash", "-c", make_tasks[0]], cwd=root, capture_output=True, text=True, timeout=120
        )
        assert made.returncode == 0, made.stderr[-3000:]
    else:  # a README that leaves the task file to its reader: made here as the benchmark makes it
        data = {"search_agent": "data/train_1hop.jsonl", "assistant": "tasks/train.jsonl"}[example]
        given = records(root / "examples" / example / data)
        (root / "TEACHER_TASKS.jsonl").write_text(
            "".join(
                json.dumps(
                    {"instance_id": t["task_id"], "problem_statement": t["prompt"], "hidden": t["hidden"]}
                )
                + "\n"
                for t in given
            )
        )
    tasks = records(root / "TEACHER_TASKS.jsonl")
    assert tasks and all({"instance_id", "problem_statement", "hidden"} <= set(t) for t in tasks)
    (root / "TEACHER_TASKS.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks[:keep]))
    expert = load_script(ROOT / "examples" / example, "expert")
    with serve_in_thread(expert.create_app()) as url:
        command = f"{calibrate} --set engine.teacher.base_url={url}/v1"
        proc = subprocess.run(["bash", "-c", command], cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])["out"]
    return root, records(root / out)


def sft_conversations(tmp_path: Path, root: Path, example: str) -> list[dict]:
    """What ``harnessrl sft`` with the example's sft.toml would train on (no model is loaded)."""
    out = tmp_path / "selected.jsonl"
    argv = [*HARNESSRL, "sft", str(root / "examples" / example / "sft.toml"), "--export-jsonl", str(out)]
    proc = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return records(out)


@pytest.mark.slow
@needs_sandbox
def test_the_search_agent_readme_teacher_commands_record_rewarded_rollouts_sft_reads(tmp_path: Path):
    root, calibrated = run_readme_teacher(tmp_path, "search_agent", keep=2)
    assert [r["calibration"]["rewards"] for r in calibrated] == [[1.0], [1.0]]
    assert len(sft_conversations(tmp_path, root, "search_agent")) == 2


@pytest.mark.slow
@needs_hermes
def test_the_assistant_readme_teacher_commands_record_rewarded_rollouts_sft_reads(tmp_path: Path):
    root, calibrated = run_readme_teacher(tmp_path, "assistant", keep=2)
    assert [r["calibration"]["rewards"] for r in calibrated] == [[1.0], [1.0]]
    assert len(sft_conversations(tmp_path, root, "assistant")) == 2


@pytest.mark.parametrize("example", ["search_agent", "assistant"])
def test_the_readme_says_how_to_make_the_teacher_task_file(example: str):
    """``TEACHER_TASKS.jsonl`` is made by a command of the block, not left to the reader."""
    assert any(c.endswith("> TEACHER_TASKS.jsonl") for c in readme_commands(example))


def test_check_py_does_not_pass_a_file_whose_tail_it_did_not_read(tmp_path: Path):
    """check.py reads 64 KiB of a file: the right word, 64 KiB of blanks, then more words is not
    "the word ... and nothing else", nor "exactly 2 lines". The control: the same files without the
    padding's tail are judged on what they hold."""
    score = load_script(ROOT / "examples" / "assistant", "check").score
    upper = [{"kind": "file", "path": "a.txt"}, {"kind": "exact", "path": "a.txt", "value": "PENCIL"}]
    count = [{"kind": "line_count", "path": "b.txt", "value": 2}]
    (tmp_path / "a.txt").write_text("PENCIL\n")
    (tmp_path / "b.txt").write_text("tiger\nsummer\n")
    assert score(upper, tmp_path)[0] == 1.0 and score(count, tmp_path)[0] == 1.0
    (tmp_path / "a.txt").write_text("PENCIL\n" + " " * 70_000 + "\nand something else\n")
    (tmp_path / "b.txt").write_text("tiger\nsummer\n" + " " * 70_000 + "\nwindow\n")
    assert score(upper, tmp_path) == (0.5, ["exact a.txt"])
    assert score(count, tmp_path)[0] == 0.0
    (tmp_path / "a.txt").write_text("PENCIL\nand something else\n")  # within 64 KiB: seen, refused
    assert score(upper, tmp_path)[0] == 0.5


@pytest.mark.parametrize("example", ["search_agent", "assistant"])
def test_a_calibrate_command_in_a_config_comment_names_records_calibrate_reads(example: str):
    """A ``data calibrate IN`` written in an example config's comments whose IN is a file of the
    repository names one with calibrate's records (an ``instance_id`` and a ``problem_statement``):
    the task files (``task_id``, ``prompt``) are refused ("every record needs a unique instance_id")."""
    for config in sorted((ROOT / "examples" / example).glob("*.toml")):
        comments = "\n".join(
            line.lstrip("# ") for line in config.read_text().splitlines() if line.startswith("#")
        )
        for given in re.findall(r"data calibrate (\S+)", comments):
            path = ROOT / given
            if path.is_file():
                first = json.loads(path.read_text().splitlines()[0])
                assert {"instance_id", "problem_statement"} <= set(first), (config.name, given)
