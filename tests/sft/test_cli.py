"""``harnessrl sft`` as a user runs it: a config naming a recorded run folder, a checkpoint that
``harnessrl train`` can start from, ``--export-jsonl``, ``--resume``, and bad input named clearly
(exit 2, one line naming the field)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
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
    # The tiny student's template has no place for reasoning given apart from the text (Messages
    # records it so; the chat API answers with it in the text, which the template keeps as text).
    rec = record([thinking], [1.0], api="messages")
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


def test_export_refuses_the_source_stores_own_files(record, solving, tmp_path):
    """``--export-jsonl`` naming the teacher's store (or its SQLite side files, or a link to it)
    replaced the recorded rollouts with JSONL: refused, naming the option, nothing written."""
    rec = record([solving], [1.0])
    config = write_config(tmp_path, rec.run_dir)
    db = rec.run_dir / "harnessrl.db"
    (tmp_path / "link.db").symlink_to(db)
    before = db.read_bytes()
    listed = sorted(p.name for p in rec.run_dir.iterdir())
    for target in (
        db,
        rec.run_dir / "harnessrl.db-wal",
        tmp_path / "link.db",
        rec.run_dir / "x" / ".." / db.name,
    ):
        line = error_line(runner.invoke(app, ["sft", str(config), "--export-jsonl", str(target)]))
        assert "--export-jsonl" in line and "source store" in line, line
    assert db.read_bytes() == before and sorted(p.name for p in rec.run_dir.iterdir()) == listed
    assert len(rec.store.list_rollouts()) == 1


def test_export_leaves_out_answers_training_skips(tmp_path):
    """Training never trains on a truncated answer (token limit, content filter) or an empty one;
    neither does the export: a line ends at the last complete answer before the first skipped one,
    and a call continuing a skipped answer is left out."""
    from harnessrl.schemas import Call, Outcome
    from harnessrl.store.sqlite import SQLiteStore

    def chat(n: int) -> list[dict]:
        history = [{"role": "user", "content": "What is in a.txt?"}]
        for i in range(n):
            history += [{"role": "assistant", "content": f"step {i}"}, {"role": "user", "content": "go on"}]
        return history

    # per rollout: its answers' (content, finish_reason), each call continuing the previous one
    rollouts = {
        "cut": [("step 0", "stop"), ("step 1", "length")],
        "filtered": [("step 0", "stop"), ("step 1", "tool_calls"), ("step 2", "content_filter")],
        "empty": [("step 0", "stop"), ("  ", "stop")],
        "first_cut": [("step 0", "length"), ("step 1", "stop")],
        "whole": [("step 0", "stop"), ("step 1", "stop")],
    }
    run_dir = tmp_path / "teacher"
    run_dir.mkdir()
    store = SQLiteStore(run_dir / "harnessrl.db")
    ids = {}
    try:
        for task, answers in rollouts.items():
            rollout = store.create_rollout(run_id="teacher", task_id=task, task={"prompt": task})
            store.start_rollout(rollout.rollout_id)
            for i, (content, finish) in enumerate(answers):
                store.add_call(
                    Call(
                        rollout_id=rollout.rollout_id,
                        request={"model": "teacher", "messages": chat(i)},
                        response={"role": "assistant", "content": content},
                        prompt_token_ids=[],
                        response_token_ids=[],
                        response_logprobs=[],
                        finish_reason=finish,
                    )
                )
            store.finish_rollout(rollout.rollout_id, Outcome.SUCCESS, 1.0)
            ids[rollout.rollout_id] = task
    finally:
        store.close()
    out = tmp_path / "teacher.jsonl"
    result = runner.invoke(app, ["sft", str(write_config(tmp_path, run_dir)), "--export-jsonl", str(out)])
    assert result.exit_code == 0, result.output
    lines = {
        ids[line["rollout_id"]]: line["messages"] for line in map(json.loads, out.read_text().splitlines())
    }
    assistant_turns = {
        task: [m["content"] for m in messages if m["role"] == "assistant"] for task, messages in lines.items()
    }
    assert assistant_turns == {
        "cut": ["step 0"],
        "filtered": ["step 0", "step 1"],
        "empty": ["step 0"],
        "whole": ["step 0", "step 1"],
    }  # "first_cut": its every line would hold the cut answer
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["answers_skipped"] == {"truncated": 3, "empty_answer": 1}


def test_a_source_store_that_is_not_a_database_is_named(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n")
    config = tmp_path / "sft.toml"
    config.write_text(f'[source]\nstore_url = "{text}"\n[metrics]\ntensorboard = false\n')
    for extra in ([], ["--export-jsonl", str(tmp_path / "out.jsonl")]):
        line = error_line(runner.invoke(app, ["sft", str(config), *extra]))
        assert "source.store_url" in line and "not a harnessrl store" in line, line
    assert text.read_text() == "not a database\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "sft.toml"]
    # A damaged store (SQLite's header, pages of garbage) is named as well.
    text.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4096)
    line = error_line(runner.invoke(app, ["sft", str(config)]))
    assert "source.store_url" in line and "cannot be read as a harnessrl store" in line, line


def test_non_finite_numbers_and_unknown_parsers_are_refused_before_anything_is_made(
    record, solving, tmp_path
):
    """``select.min_reward = nan`` kept every rollout (nan compares false); ``optimizer.lr = inf``
    passed its bound; a bad parser name was reported as ``gateway.*`` after the folder existed."""
    rec = record([solving], [1.0])
    config = str(write_config(tmp_path, rec.run_dir))
    for setting, named in [
        ("select.min_reward=nan", "select.min_reward"),
        ("select.min_reward=-inf", "select.min_reward"),
        ("optimizer.lr=inf", "optimizer.lr"),
        ("optimizer.betas=[nan, 0.9]", "optimizer.betas"),
        ("sft.tool_call_parser=nope", "sft.tool_call_parser"),
        ("sft.reasoning_parser=nope", "sft.reasoning_parser"),
    ]:
        line = error_line(runner.invoke(app, ["sft", config, "--set", setting]))
        assert f" {named}: " in line and "gateway." not in line, (setting, line)
    assert not (tmp_path / "runs").exists()
    out = tmp_path / "all.jsonl"
    assert "select.min_reward" in error_line(
        runner.invoke(app, ["sft", config, "--set", "select.min_reward=nan", "--export-jsonl", str(out)])
    )
    assert not out.exists()


def test_resume_refuses_a_change_of_what_the_steps_train(record, solving, tmp_path):
    """A ``--resume`` that changed the seed or the batch size reordered the epoch mid-way (some
    sequences trained twice, others never); one that changed what the sequences are, or asked for
    LoRA on a full fine-tune (which crashed after saving the new config, so a plain --resume failed
    too), is refused as well: exit 2 naming the field, the run's config as it was."""
    from harnessrl.sft.run import SftRun, prepare_sft_run

    rec = record([solving, solving, solving], [1.0, 1.0, 1.0])
    config, run_dir = prepare_sft_run(str(write_config(tmp_path, rec.run_dir)), None, [])
    assert SftRun(config, run_dir, stop_after=1).run()["steps"] == 1
    saved = (run_dir / "config.json").read_text()
    for setting, named in [
        ("run.seed=7", "run.seed"),
        ("sft.sequences_per_step=3", "sft.sequences_per_step"),
        ("sft.max_sequence_tokens=64", "sft.max_sequence_tokens"),
        ("sft.chat_template_kwargs.enable_thinking=false", "sft.chat_template_kwargs"),
        ("sft.tool_call_parser=hermes", "sft.tool_call_parser"),
        ("sft.reasoning_parser=qwen3", "sft.reasoning_parser"),
        ("sft.lora.r=2", "sft.lora"),
    ]:
        line = error_line(runner.invoke(app, ["sft", "--resume", str(run_dir), "--set", setting]))
        assert f"error: {named}" in line and "cannot change on --resume" in line, (setting, line)
        assert (run_dir / "config.json").read_text() == saved

    # the same rollouts rendered into other sequences (another tokenizer or renderer) are refused too
    data = json.loads((run_dir / "sft_data.json").read_text())
    (run_dir / "sft_data.json").write_text(json.dumps({**data, "samples_sha256": "0" * 64}))
    line = error_line(runner.invoke(app, ["sft", "--resume", str(run_dir)]))
    assert "training sequences changed" in line
    # a file a kill cut short is named, not read as "no hash" (the check skipped without a word)
    (run_dir / "sft_data.json").write_text(json.dumps({**data, "samples_sha256": "0" * 64})[:40])
    line = error_line(runner.invoke(app, ["sft", "--resume", str(run_dir)]))
    assert "sft_data.json cannot be read" in line, line
    (run_dir / "sft_data.json").write_text(json.dumps(data))
    assert not list(run_dir.glob("*.partial"))  # the data report was replaced whole

    # what only adds epochs is fine, and the plain --resume finishes the run
    result = runner.invoke(app, ["sft", "--resume", str(run_dir), "--set", "sft.epochs=1"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["steps"] == 2
    assert json.loads((run_dir / "config.json").read_text())["sft"]["epochs"] == 1


def test_a_resume_whose_checkpoint_fails_to_load_keeps_the_runs_config(record, solving, tmp_path):
    """The merged config is saved only once the policy and its trainer state loaded: a failed
    ``--resume --set ...`` leaves the config the next plain ``--resume`` reads as it was."""
    from harnessrl.sft.run import SftRun, prepare_sft_run
    from harnessrl.trainer.checkpoint import latest_checkpoint

    rec = record([solving, solving, solving], [1.0, 1.0, 1.0])
    config, run_dir = prepare_sft_run(str(write_config(tmp_path, rec.run_dir)), None, [])
    SftRun(config, run_dir, stop_after=1).run()
    saved = (run_dir / "config.json").read_text()
    checkpoint = latest_checkpoint(run_dir)
    assert checkpoint is not None
    (checkpoint / "trainer_state.pt").write_bytes(b"not a state dict")  # the optimizer's state
    resumed, _ = prepare_sft_run(None, str(run_dir), ["sft.epochs=5"])
    with pytest.raises(Exception):  # noqa: B017 (whatever torch raises for a damaged file)
        SftRun(resumed, run_dir, resume=True).run()
    assert (run_dir / "config.json").read_text() == saved


def test_a_signal_during_start_up_leaves_no_folder_that_resume_cannot_continue(record, solving, tmp_path):
    """Ctrl-C while a new run loads (before its config.json) left a folder holding only .lock: the
    printed ``--resume`` failed ("no config.json there") and the same command said "already
    exists". Now the folder is removed and the message says to run the command again; a signal
    that lands after the first step still names a ``--resume`` that works."""
    import signal
    import subprocess
    import sys
    import time

    rec = record([solving], [1.0])
    config = write_config(tmp_path, rec.run_dir)
    run_dir = tmp_path / "runs/student"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harnessrl", "sft", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (run_dir / ".lock").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, err[-2000:]
    if "--resume" in err:  # it got past its start-up: what it names must continue it
        assert (run_dir / "config.json").is_file(), err[-2000:]
    else:
        assert f"SIGINT: sft run stopped while starting; nothing was kept in {run_dir}" in err, err[-2000:]
        assert not run_dir.exists() and not (tmp_path / "runs").exists()


def test_run_dir_may_be_neither_empty_nor_set_on_resume(record, solving, tmp_path):
    """As ``harnessrl train``'s: ``run.dir = ""`` used the default folder without a word, and a
    ``--resume``'s ``--set run.dir=…`` was saved into the resumed folder's config.json."""
    from harnessrl.errors import ConfigError
    from harnessrl.sft.run import prepare_sft_run, save_config

    rec = record([solving], [1.0])
    path = write_config(tmp_path, rec.run_dir)
    with pytest.raises(ConfigError, match="run.dir is empty"):
        prepare_sft_run(str(path), None, ["run.dir=''"])
    assert not (tmp_path / "runs").exists()
    config, run_dir = prepare_sft_run(str(path), None, [])  # the control: the default folder
    save_config(config, run_dir)
    saved = (run_dir / "config.json").read_text()
    with pytest.raises(ConfigError, match=r"run\.dir: cannot be set on --resume"):
        prepare_sft_run(None, str(run_dir), [f"run.dir={tmp_path / 'elsewhere'}"])
    assert (run_dir / "config.json").read_text() == saved
    prepare_sft_run(None, str(run_dir), ["sft.epochs=3"])  # the control: another override is taken


def test_a_lora_section_sft_cannot_apply_is_named_as_sft_lora(record, solving, tmp_path):
    """``[sft.lora]`` is checked against the student like ``[trainer.lora]``: its errors named
    ``trainer.lora.*``, a section an sft config does not have."""
    rec = record([solving], [1.0])
    config = str(write_config(tmp_path, rec.run_dir))
    for setting, named in [
        ('sft.lora.target_modules=["nope"]', "sft.lora.target_modules"),
        ("sft.lora.r=999", "sft.lora.r"),
    ]:
        result = runner.invoke(app, ["sft", config, "--set", setting])
        line = error_line(result)
        assert result.exit_code == 2 and f" {named}: " in line and "trainer." not in line, (setting, line)
    assert not (tmp_path / "runs").exists()
