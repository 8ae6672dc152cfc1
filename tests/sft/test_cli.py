"""``harnessrl sft`` as a user runs it: a config naming a recorded run folder, a checkpoint that
``harnessrl train`` can start from, ``--export-jsonl``, ``--resume``, and bad input named clearly
(exit 2, one line naming the field)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from harnessrl.cli.main import app

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]

runner = CliRunner()


def write_config(tmp_path: Path, teacher: Path, **select: object) -> Path:
    lines = [
        "[run]",
        'name = "student"',
        "[source]",
        f'run_dir = "{teacher}"',
        "[select]",
        *(f"{k} = {json.dumps(v)}" for k, v in select.items()),
        "[sft]",
        'model = "tiny"',
        "epochs = 2",
        "sequences_per_step = 2",
        "[metrics]",
        "tensorboard = false",
        "progress = false",
    ]
    path = tmp_path / "sft.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_sft_trains_a_checkpoint_train_starts_from(record, solving, tmp_path):
    rec = record([solving, solving, solving], [1.0, 0.0, 1.0])
    config = write_config(tmp_path, rec.run_dir)
    result = runner.invoke(app, ["sft", str(config)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["rollouts"] == 2 and summary["sequences"] == 2 and summary["steps"] == 2
    final = Path(summary["checkpoint"])
    assert final == tmp_path / "runs/student/checkpoints/final"
    assert (final / "config.json").is_file() and (final / "chat_template.jinja").is_file()
    assert json.loads((final / "harnessrl_final.json").read_text()) == {"step": 2}
    rows = [json.loads(line) for line in (tmp_path / "runs/student/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["sft/loss"] > 0 for r in rows)
    data = json.loads((tmp_path / "runs/student/sft_data.json").read_text())
    assert data["rollouts_dropped"] == {"below_reward": 1}

    # the dashboard charts it as it charts a train run (and overlays it with one)
    from starlette.testclient import TestClient

    from harnessrl.dashboard import create_dashboard_app

    with TestClient(create_dashboard_app(tmp_path / "runs/student", "k")) as dashboard:
        page = dashboard.get("/ui/?key=k")
        assert page.status_code == 200 and "sft/loss" in page.text

    # and RL starts from it: one step of the tiny example's harnessed train on the SFT weights
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    rl = tmp_path / "rl"
    sets = [f"engine.model={final}", "trainer.steps=1", "trainer.tasks_per_step=1", "trainer.group_size=2"]
    sets += ["metrics.progress=false", "metrics.tensorboard=false"]
    cmd = [
        sys.executable,
        "-m",
        "harnessrl",
        "train",
        str(repo / "examples/tiny/train.toml"),
        "--run-dir",
        str(rl),
    ]
    proc = subprocess.run(
        [*cmd, *(arg for item in sets for arg in ("--set", item))],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((rl / "config.json").read_text())["engine"]["model"] == str(final)
    assert json.loads(proc.stdout.strip().splitlines()[-1])["steps"] == 1


def error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("harnessrl: error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def test_a_missing_store_is_named(tmp_path):
    config = write_config(tmp_path, tmp_path / "nowhere")
    line = error_line(runner.invoke(app, ["sft", str(config)]))
    assert "source.run_dir" in line and "nowhere" in line and "no recorded rollouts" in line
    assert not (tmp_path / "runs").exists()  # a bad config leaves nothing behind


def test_a_selection_that_matches_nothing_says_why(record, solving, tmp_path):
    rec = record(
        [solving, solving, solving, solving],
        [0.0, 0.5, 1.0, 1.0],
        flags=[[], [], ["verdict_disagreement"], []],
        audit=[False, False, False, True],
    )
    config = write_config(tmp_path, rec.run_dir, min_reward=0.9)
    line = error_line(runner.invoke(app, ["sft", str(config)]))
    assert "select: no recorded rollout matches the selection" in line
    assert "0 of 4 rollouts selected" in line
    assert "1 audit flagged" in line and "1 flagged" in line and "2 below reward" in line
    assert "min_reward = 0.9" in line
    assert not (tmp_path / "runs").exists()

    # allowing the scorer's flag keeps that rollout; an audit finding is never allowed
    config = write_config(
        tmp_path, rec.run_dir, min_reward=0.9, allow_flags=["verdict_disagreement", "git_history"]
    )
    out = tmp_path / "kept.jsonl"
    result = runner.invoke(app, ["sft", str(config), "--export-jsonl", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["rollouts"] == 1
    assert [json.loads(line)["rollout_id"] for line in out.read_text().splitlines()] == [rec.rollout_ids[2]]


def test_export_jsonl_writes_each_conversation_once_in_openai_form(record, solving, tmp_path):
    rec = record([solving, solving], [1.0, 1.0])
    out = tmp_path / "out" / "teacher.jsonl"
    result = runner.invoke(app, ["sft", str(write_config(tmp_path, rec.run_dir)), "--export-jsonl", str(out)])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 2  # two rollouts of two calls each: call 2 continues call 1's conversation
    line = lines[0]
    assert line["rollout_id"] == rec.rollout_ids[0] and line["reward"] == 1.0
    assert line["tools"][0]["function"]["name"] == "bash"
    roles = [m["role"] for m in line["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    call = line["messages"][2]["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "bash"
    assert json.loads(call["function"]["arguments"]) == {
        "command": "cat a.txt"
    }  # a JSON string, as OpenAI sends
    assert line["messages"][3]["tool_call_id"] == call["id"]
    assert line["messages"][-1]["content"] == "The answer is 42."
    assert not (tmp_path / "runs").exists()  # exporting trains nothing


def test_export_keeps_the_reasoning_of_turns_the_harness_resent_without_it(tmp_path):
    """A teacher's answers as teacher mode records them (the upstream's ``reasoning_content`` kept),
    asked by an OpenAI chat client that resends its history without ``reasoning_content``, as most
    do: the first call is inside the second call's line, where its turn is the recorded answer,
    reasoning included (and the tool-call id the tool result answers to)."""
    from harnessrl.schemas import Call, Outcome
    from harnessrl.store.sqlite import SQLiteStore

    tool_call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command": "cat a.txt"}'},
    }
    first = {
        "role": "assistant",
        "content": "Let me look.",
        "reasoning_content": "I should read the file first.",
        "tool_calls": [tool_call],
    }
    second = {"role": "assistant", "content": "The answer is 42.", "reasoning_content": "It says 42."}
    history = [{"role": "system", "content": "Be careful."}, {"role": "user", "content": "What is in a.txt?"}]
    resent = {k: v for k, v in first.items() if k != "reasoning_content"}
    requests = [history, [*history, resent, {"role": "tool", "tool_call_id": "call_1", "content": "42\n"}]]
    run_dir = tmp_path / "teacher"
    run_dir.mkdir()
    store = SQLiteStore(run_dir / "harnessrl.db")
    try:
        rollout = store.create_rollout(run_id="teacher", task_id="t0", task={"prompt": "a.txt"})
        store.start_rollout(rollout.rollout_id)
        for messages, answer in zip(requests, [first, second], strict=True):
            store.add_call(
                Call(
                    rollout_id=rollout.rollout_id,
                    request={"model": "teacher", "messages": messages, "tools": TOOLS},
                    response=answer,
                    prompt_token_ids=[],
                    response_token_ids=[],
                    response_logprobs=[],
                )
            )
        store.finish_rollout(rollout.rollout_id, Outcome.SUCCESS, 1.0)
    finally:
        store.close()
    out = tmp_path / "teacher.jsonl"
    result = runner.invoke(app, ["sft", str(write_config(tmp_path, run_dir)), "--export-jsonl", str(out)])
    assert result.exit_code == 0, result.output
    (line,) = [json.loads(text) for text in out.read_text().splitlines()]
    assert line["messages"][:2] == history
    assert line["messages"][2:] == [first, requests[1][3], second]


def test_export_ignores_an_existing_run_folder(record, solving, tmp_path):
    """An export writes no run folder, so the config's existing one (a trained student) is no reason
    to refuse it, and is left as it was."""
    rec = record([solving], [1.0])
    config = write_config(tmp_path, rec.run_dir)
    run_dir = tmp_path / "runs" / "student"
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text("{}")
    out = tmp_path / "teacher.jsonl"
    result = runner.invoke(app, ["sft", str(config), "--export-jsonl", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["conversations"] == 1
    assert out.read_text().count("\n") == 1
    assert [p.name for p in run_dir.iterdir()] == ["config.json"]
    # training with that config is still refused: the folder holds a run
    assert "already exists" in error_line(runner.invoke(app, ["sft", str(config)]))


def test_resume_of_a_folder_that_is_not_an_sft_run(tmp_path):
    line = error_line(runner.invoke(app, ["sft", "--resume", str(tmp_path)]))
    assert "--resume" in line and "config.json" in line


def test_answers_no_student_template_can_express_are_a_clear_error(record, tmp_path):
    thinking = [
        {"reasoning": "cat the file", "content": "", "tool_calls": [{"name": "bash", "arguments": {}}]}
    ]
    rec = record([thinking], [1.0])  # the tiny student's template has no place for reasoning
    line = error_line(runner.invoke(app, ["sft", str(write_config(tmp_path, rec.run_dir))]))
    assert "1 rollouts selected, but none of their" in line and "reasoning_dropped" in line


def test_sft_help_and_export_import_no_torch(record, solving, tmp_path):
    """As every command: the config is checked, and an export done, without paying for torch."""
    import subprocess
    import sys

    rec = record([solving], [1.0])
    config = write_config(tmp_path, rec.run_dir)
    code = (
        "import sys; from harnessrl.cli.sft import run_sft; "
        f"print(run_sft({str(config)!r}, None, [], {str(tmp_path / 'x.jsonl')!r})); "
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; sys.exit(f'imported {bad}' if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "x.jsonl").read_text().count("\n") == 1
    both = runner.invoke(
        app, ["sft", str(config), "--run-dir", str(tmp_path / "a"), "--resume", str(tmp_path)]
    )
    assert "not both" in error_line(both)
    assert "--run-dir" in runner.invoke(app, ["sft", "--help"]).output


def test_sigterm_stops_a_run_cleanly_and_resume_finishes_it(record, solving, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    rec = record([solving, solving, solving], [1.0, 1.0, 1.0])
    config = write_config(tmp_path, rec.run_dir)
    run_dir = tmp_path / "runs/student"
    cmd = [sys.executable, "-m", "harnessrl", "sft", str(config), "--set", "sft.epochs=400"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 1):  # a step is done
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert f"SIGTERM: sft run stopped; continue it with: harnessrl sft --resume {run_dir}" in err

    done = json.loads(metrics.read_text().splitlines()[-1])["step"]
    epochs = done // 2 + 1  # 3 sequences, 2 per step: 2 steps an epoch
    result = runner.invoke(app, ["sft", "--resume", str(run_dir), "--set", f"sft.epochs={epochs}"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["steps"] == summary["total_steps"] == 2 * epochs > done
    assert (run_dir / "checkpoints/final/model.safetensors").is_file()
