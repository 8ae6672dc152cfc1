"""``harnessrl data calibrate`` end to end: the real rollout stack (gateway, scripted engine, sandbox,
evaluator, audit) runs a tiny agent k times per task; pass counts land in the output and a second
run resumes, calibrating only the new task. Then ``select`` runs on the result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.fakes.skilled_agent import skilled_agent

from harnessrl.data.records import read_records, write_records

HARNESSRL = [sys.executable, "-m", "harnessrl"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")

AGENT = skilled_agent("solve_k")  # solves the first task["solve_k"] samples of its task


def record(i: int, solve_k: int) -> dict:
    return {
        "instance_id": f"owner__proj.abc.task_{i}",
        "repo": "swesmith/owner__proj.abc",
        "image_name": "img",
        "base_commit": "0" * 40,
        "problem_statement": f"Task {i}: reply with the answer.",
        "FAIL_TO_PASS": '["tests/test_x.py::test_x"]',
        "PASS_TO_PASS": [],
        "answer": "42",
        "solve_k": solve_k,
    }


def calibrate(tmp_path: Path, records: list[dict], name: str, config: str = "rollout.toml") -> dict:
    src = tmp_path / f"{name}.jsonl"
    write_records(src, records)
    proc = subprocess.run(
        [
            *HARNESSRL,
            "data",
            "calibrate",
            str(src),
            str(tmp_path / "calibrated.jsonl"),
            "--config",
            str(tmp_path / config),
            "--k",
            "4",
            "--run-dir",
            str(tmp_path / f"run-{name}"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rollout_toml(tmp_path: Path) -> str:
    return f"""
[engine]
model = "scripted:{tmp_path / "script.json"}"

[harness]
preset = "python"
command = ["./agent.py", "{{prompt}}"]
timeout_s = 60

[evaluator]
type = "exact_match"
field = "hidden.answer"        # to_task moves the record's top-level answer under hidden
pattern = 'Answer:\\s*(-?[0-9.]+)'
source = "stdout"

[controller]
concurrency = 4
max_infra_retries = 0
poll_interval_s = 0.2
"""


def test_calibrate_records_pass_counts_and_resumes(tmp_path: Path):
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "script.json").write_text(json.dumps({"turns": [{"content": "Answer: 42"}]}))
    (tmp_path / "rollout.toml").write_text(rollout_toml(tmp_path))
    first = [record(0, 0), record(1, 1), record(2, 3), record(3, 4)]
    report = calibrate(tmp_path, first, "first")
    assert (report["calibrated"], report["rollouts"], report["skipped_already_done"]) == (4, 16, 0)
    assert (report["never_solved"], report["mixed"], report["always_solved"]) == (1, 2, 1)
    out = read_records(tmp_path / "calibrated.jsonl")
    assert [r["calibration"]["passes"] for r in out] == [0, 1, 3, 4]
    assert out[2]["calibration"]["rewards"] == [1.0, 1.0, 1.0, 0.0]
    assert all(r["calibration"]["k"] == 4 and r["calibration"]["infra_failures"] == 0 for r in out)
    assert out[0]["answer"] == "42"  # the record itself is passed through unchanged

    # Resume: the four done tasks are skipped, only the new one runs; OUT stays in input order.
    report = calibrate(tmp_path, [*first[:2], record(4, 2), *first[2:]], "second")
    assert (report["calibrated"], report["skipped_already_done"], report["rollouts"]) == (1, 4, 4)
    out = read_records(tmp_path / "calibrated.jsonl")
    assert [r["instance_id"][-6:] for r in out] == ["task_0", "task_1", "task_4", "task_2", "task_3"]
    assert [r["calibration"]["passes"] for r in out] == [0, 1, 2, 3, 4]

    proc = subprocess.run(
        [*HARNESSRL, "data", "select", str(tmp_path / "calibrated.jsonl"), str(tmp_path / "sel.jsonl")]
        + ["--unsolvable", "1", "--seed", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    selected = read_records(tmp_path / "sel.jsonl")
    assert [r["instance_id"][-6:] for r in selected] == ["task_0", "task_1", "task_4", "task_2"]


def test_a_training_config_samples_as_its_training_rollouts_do(tmp_path: Path):
    """With a training config, every calibration call gets the run's [trainer] sampling, whatever
    the harness asks: a pass rate measured as training will sample. The token cap is visible in the
    outcome: the scripted answer "Answer: 42" cut to 2 tokens no longer passes (the control, the same
    tasks through the rollout config, passes as the agent chooses)."""
    from harnessrl.store.sqlite import SQLiteStore

    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "script.json").write_text(json.dumps({"turns": [{"content": "Answer: 42"}]}))
    (tmp_path / "rollout.toml").write_text(rollout_toml(tmp_path))
    training = rollout_toml(tmp_path) + "\n[trainer]\ntemperature = 0.7\nmax_tokens = 2\n"
    training += '\n[tasks]\ntype = "jsonl"\npath = "unused.jsonl"\n'  # ignored, as [run], [tasks]...
    (tmp_path / "train.toml").write_text(training)
    tasks = [record(0, 2), record(1, 4)]

    control = calibrate(tmp_path, tasks, "control")
    assert control["sampling"] == "the harness's"
    assert [r["calibration"]["passes"] for r in read_records(tmp_path / "calibrated.jsonl")] == [2, 4]

    # OUT holds both tasks calibrated with the harness's sampling: not done for this sampling.
    report = calibrate(tmp_path, tasks, "trained", config="train.toml")
    assert report["sampling"] == {"temperature": 0.7, "top_p": 1.0, "max_tokens": 2}
    assert (report["calibrated"], report["skipped_already_done"]) == (2, 0)
    out = read_records(tmp_path / "calibrated.jsonl")
    assert [r["calibration"]["passes"] for r in out] == [0, 0]
    assert all(r["calibration"]["sampling"] == report["sampling"] for r in out)
    assert calibrate(tmp_path, tasks, "again", config="train.toml")["skipped_already_done"] == 2
    store = SQLiteStore(tmp_path / "run-trained" / "harnessrl.db")
    try:
        for rollout_id in out[1]["calibration"]["rollout_ids"]:
            assert store.get_rollout(rollout_id).metadata["sampling"] == report["sampling"]
            (call,) = store.list_calls(rollout_id)
            assert len(call.response_token_ids) == 2
    finally:
        store.close()


def calibrated(record_: dict, passes: int) -> dict:
    """``record_`` as an earlier ``calibrate`` wrote it (k=4, the harness's sampling)."""
    rewards = [1.0] * passes + [0.0] * (4 - passes)
    calibration = {"k": 4, "passes": passes, "rewards": rewards, "outcomes": ["success"] * 4}
    calibration |= {"infra_failures": 0, "flagged": 0, "rollout_ids": [f"cal-{passes}-{i}" for i in range(4)]}
    return {**record_, "calibration": calibration}


def calibrate_in_process(tmp_path: Path, src: Path, out: Path):
    from typer.testing import CliRunner

    from harnessrl.cli.main import app

    args = ["data", "calibrate", str(src), str(out), "--config", str(tmp_path / "rollout.toml")]
    return CliRunner().invoke(app, [*args, "--k", "4", "--run-dir", str(tmp_path / "run")])


def select_in_process(src: Path, out: Path):
    from typer.testing import CliRunner

    from harnessrl.cli.main import app

    return CliRunner().invoke(app, ["data", "select", str(src), str(out)])


def test_resume_writes_ins_records_and_drops_tasks_no_longer_in_it(tmp_path: Path):
    """Records pass through unchanged: a done task is IN's record as it is now (a FAIL_TO_PASS fixed
    since) with OUT's calibration; OUT's lines for tasks IN no longer has are dropped and counted, and
    every count is over IN. Nothing is left to run, so no rollout starts."""
    (tmp_path / "rollout.toml").write_text(rollout_toml(tmp_path))
    a, b, gone = record(0, 0), record(1, 0), record(2, 0)
    write_records(tmp_path / "out.jsonl", [calibrated(a, 0), calibrated(b, 2), calibrated(gone, 4)])
    fixed = {**b, "FAIL_TO_PASS": '["tests/test_x.py::test_y"]'}
    write_records(tmp_path / "in.jsonl", [fixed, a])
    result = calibrate_in_process(tmp_path, tmp_path / "in.jsonl", tmp_path / "out.jsonl")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert read_records(tmp_path / "out.jsonl") == [
        {**fixed, "calibration": calibrated(b, 2)["calibration"]},
        calibrated(a, 0),
    ]
    assert (report["skipped_already_done"], report["dropped_not_in_input"], report["calibrated"]) == (2, 1, 0)
    assert (report["input"], report["never_solved"], report["mixed"], report["always_solved"]) == (2, 1, 1, 0)


def test_calibrating_a_file_into_itself_is_refused(tmp_path: Path):
    """OUT is rewritten while the run goes: IN == OUT would lose IN (here: the same file by another
    path)."""
    (tmp_path / "rollout.toml").write_text(
        rollout_toml(tmp_path).replace('"./agent.py", "{prompt}"', '"true"')
    )
    (tmp_path / "script.json").write_text(json.dumps({"turns": [{"content": "Answer: 42"}]}))
    src = write_records(tmp_path / "in.jsonl", [record(0, 0)])
    before = src.read_bytes()
    (tmp_path / "sub").mkdir()
    result = calibrate_in_process(tmp_path, src, tmp_path / "sub" / ".." / "in.jsonl")
    assert result.exit_code == 2, result.output
    assert "OUT is IN" in result.output and "Traceback" not in result.output
    assert src.read_bytes() == before


def test_a_batch_that_runs_out_of_time_is_a_clear_error(tmp_path: Path):
    """``run_until_done``'s TimeoutError becomes one error naming the tasks and how to resume, after
    the stack shut the running harnesses down; OUT keeps what finished, and every line it had (a task
    no longer in IN is dropped only by a run that completes)."""
    import asyncio

    from harnessrl.cli.rollout import load_rollout_config
    from harnessrl.data.calibrate import CalibrationTimeout, calibrate_file

    (tmp_path / "agent.py").write_text("#!/usr/bin/env python3\nimport time\ntime.sleep(120)\n")
    (tmp_path / "agent.py").chmod(0o755)
    (tmp_path / "script.json").write_text(json.dumps({"turns": [{"content": "Answer: 42"}]}))
    (tmp_path / "rollout.toml").write_text(rollout_toml(tmp_path))
    src = write_records(tmp_path / "in.jsonl", [record(0, 0)])
    done = calibrated(record(1, 0), 1)
    out = write_records(tmp_path / "out.jsonl", [done])
    config = load_rollout_config(str(tmp_path / "rollout.toml"), [])
    with pytest.raises(
        CalibrationTimeout, match=r"rollouts of owner__proj\.abc\.task_0 were not done after 1 s"
    ):
        asyncio.run(calibrate_file(config, src, out, k=1, run_dir=tmp_path / "run", batch_timeout_s=1))
    assert read_records(out) == [done]  # task_1 is not in IN, but the run did not end; task_0 did not finish


def test_an_interrupted_run_with_another_k_loses_none_of_outs_calibrations(tmp_path: Path):
    """A resume that forgot ``--k 4`` (or a subset IN, a Ctrl-C) rewrote OUT at its start with only the
    tasks done at the new k: an hour of k=4 rollouts gone before the first new one finished. Now OUT
    keeps every line until a run completes, and a later run at k=4 finds its k=4 line even after a
    line of another k for the same task."""
    import asyncio

    from harnessrl.cli.rollout import load_rollout_config
    from harnessrl.data.calibrate import CalibrationTimeout, calibrate_file

    (tmp_path / "agent.py").write_text("#!/usr/bin/env python3\nimport time\ntime.sleep(120)\n")
    (tmp_path / "agent.py").chmod(0o755)
    (tmp_path / "script.json").write_text(json.dumps({"turns": [{"content": "Answer: 42"}]}))
    (tmp_path / "rollout.toml").write_text(rollout_toml(tmp_path))
    a, b = record(0, 0), record(1, 0)
    src = write_records(tmp_path / "in.jsonl", [a, b])
    other_k = {**a, "calibration": {**calibrated(a, 1)["calibration"], "k": 2, "rewards": [1.0, 0.0]}}
    lines = [calibrated(a, 3), calibrated(b, 2), other_k]
    out = write_records(tmp_path / "out.jsonl", lines)
    config = load_rollout_config(str(tmp_path / "rollout.toml"), [])
    with pytest.raises(CalibrationTimeout):
        asyncio.run(calibrate_file(config, src, out, k=1, run_dir=tmp_path / "run", batch_timeout_s=1))
    assert read_records(out) == lines  # nothing of OUT lost (the k=1 batch did not finish)
    # ...and OUT says it is unfinished: select on it chose from the tasks done so far, silently.
    refused = select_in_process(out, tmp_path / "sel.jsonl")
    assert refused.exit_code == 2, refused.output
    assert "unfinished calibration" in refused.output and "out.jsonl.calibrating" in refused.output
    assert not (tmp_path / "sel.jsonl").exists()

    result = calibrate_in_process(tmp_path, src, out)  # --k 4: both done, task_0's k=4 line found
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert (report["skipped_already_done"], report["calibrated"], report["mixed"]) == (2, 0, 2)
    assert read_records(out) == lines[:2]
    assert not (tmp_path / "out.jsonl.calibrating").exists()  # finished: select takes it (the control)
    selected = select_in_process(out, tmp_path / "sel.jsonl")
    assert selected.exit_code == 0, selected.output
    assert len(read_records(tmp_path / "sel.jsonl")) == 2


def test_a_last_line_cut_short_by_a_crash_is_measured_again(tmp_path: Path):
    """``append_record`` killed mid-write (OOM, a full disk) leaves a last line without its newline:
    the resume refused OUT as bad JSON, so the run could not resume without editing OUT by hand. Now
    the fragment is left out (its task runs again) and every whole line is kept; a bad line that is
    not the last stays an error."""
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "script.json").write_text(json.dumps({"turns": [{"content": "Answer: 42"}]}))
    (tmp_path / "rollout.toml").write_text(rollout_toml(tmp_path))
    a, b = record(0, 0), record(1, 3)
    src = write_records(tmp_path / "in.jsonl", [a, b])
    out = write_records(tmp_path / "out.jsonl", [calibrated(a, 0)])
    with out.open("a") as fh:
        fh.write(json.dumps(calibrated(b, 4))[:70])  # the append of task_1, cut short
    result = calibrate_in_process(tmp_path, src, out)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert (report["skipped_already_done"], report["calibrated"]) == (1, 1)
    assert [r["calibration"]["passes"] for r in read_records(out)] == [0, 3]

    out.write_text("{oops\n" + json.dumps(calibrated(a, 0)) + "\n")  # not a torn append: refused
    result = calibrate_in_process(tmp_path, src, out)
    assert result.exit_code == 2 and "out.jsonl:1: not valid JSON" in result.output


def test_a_damaged_calibration_in_out_is_measured_again(tmp_path: Path):
    """A line of OUT whose calibration no ``calibrate`` wrote (no ``passes``, a count as text, more
    passes than k) was taken as done: carried into OUT as it was, and the run ended in a traceback
    from its report after the other tasks' rollouts. Its task is measured again."""
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "script.json").write_text(json.dumps({"turns": [{"content": "Answer: 42"}]}))
    (tmp_path / "rollout.toml").write_text(rollout_toml(tmp_path))
    a, b, c = record(0, 0), record(1, 3), record(2, 4)
    src = write_records(tmp_path / "in.jsonl", [a, b, c])
    damaged = [calibrated(a, 0), calibrated(b, 3), calibrated(c, 4)]
    del damaged[0]["calibration"]["passes"]
    damaged[1]["calibration"]["passes"] = "3"
    damaged[2]["calibration"]["passes"] = 9
    out = write_records(tmp_path / "out.jsonl", damaged)
    result = calibrate_in_process(tmp_path, src, out)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert (report["skipped_already_done"], report["calibrated"]) == (0, 3)
    assert [r["calibration"]["passes"] for r in read_records(out)] == [0, 3, 4]


def test_a_last_line_cut_inside_a_character_is_measured_again_too(tmp_path: Path):
    """Records are appended with their non-ASCII text raw, so a crash mid-append can cut a line inside
    a character. Decoding OUT whole then refused it ("cannot read ...: 'utf-8' codec can't decode"),
    and with it every resume. Each line is decoded on its own now: the cut one is a torn last line
    (its task runs again), every whole line is kept; the control cuts the same line at an ASCII byte."""
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "script.json").write_text(json.dumps({"turns": [{"content": "Answer: 42"}]}))
    (tmp_path / "rollout.toml").write_text(rollout_toml(tmp_path))
    a = record(0, 0)
    b = {**record(1, 3), "problem_statement": "Tâche 1 : réponds par la réponse."}
    src = write_records(tmp_path / "in.jsonl", [a, b])
    line = (json.dumps(calibrated(b, 4), ensure_ascii=False) + "\n").encode()
    inside = line.index("â".encode()) + 1  # between the two bytes of "â"
    for cut in (inside - 1, inside):  # the control first: cut at the ASCII byte before it
        out = write_records(tmp_path / "out.jsonl", [calibrated(a, 0)])
        with out.open("ab") as fh:
            fh.write(line[:cut])
        result = calibrate_in_process(tmp_path, src, out)
        assert result.exit_code == 0, (cut, result.output)
        report = json.loads(result.stdout.strip().splitlines()[-1])
        assert (report["skipped_already_done"], report["calibrated"]) == (1, 1)
        assert read_records(out) == [
            calibrated(a, 0),
            {**b, "calibration": read_records(out)[1]["calibration"]},
        ]
        assert read_records(out)[1]["calibration"]["passes"] == 3

    out.write_bytes(b"\xff\xfe\n" + json.dumps(calibrated(a, 0)).encode() + b"\n")  # not a torn append
    result = calibrate_in_process(tmp_path, src, out)
    assert result.exit_code == 2 and "out.jsonl:1: not UTF-8" in result.output, result.output


def test_a_record_whose_hidden_is_no_object_is_refused_naming_it(tmp_path: Path):
    """``to_task`` ran ``dict(record["hidden"])``: a string was a ValueError traceback once the
    environments were being checked (a list of pairs silently became an object)."""
    (tmp_path / "rollout.toml").write_text(rollout_toml(tmp_path))
    (tmp_path / "script.json").write_text(json.dumps({"turns": [{"content": "Answer: 42"}]}))
    src = write_records(tmp_path / "in.jsonl", [record(0, 0), {**record(1, 0), "hidden": "tests/x"}])
    out = tmp_path / "out.jsonl"
    result = calibrate_in_process(tmp_path, src, out)
    assert result.exit_code == 2, result.output
    assert "'owner__proj.abc.task_1': 'hidden' must be a JSON object" in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_ctrl_c_stops_with_a_line_not_a_traceback_and_keeps_out(tmp_path: Path):
    import signal

    from tests.controller.test_lifecycle_kill import sandbox_processes, wait_for

    (tmp_path / "agent.py").write_text("#!/usr/bin/env python3\nimport time\ntime.sleep(600)\n")
    (tmp_path / "agent.py").chmod(0o755)
    sleep = str(tmp_path / "agent.py")  # in the agent's command line: no other test's
    (tmp_path / "script.json").write_text(json.dumps({"turns": [{"content": "Answer: 42"}]}))
    (tmp_path / "rollout.toml").write_text(rollout_toml(tmp_path))
    src = write_records(tmp_path / "in.jsonl", [record(0, 0)])
    out = write_records(tmp_path / "out.jsonl", [calibrated(record(1, 0), 2)])  # an earlier run's line
    argv = [*HARNESSRL, "data", "calibrate", str(src), str(out), "--config", str(tmp_path / "rollout.toml")]
    argv += ["--k", "1", "--run-dir", str(tmp_path / "run")]  # not a folder of the host's /tmp
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: sandbox_processes(sleep) != [] or proc.poll() is not None, timeout_s=120)
        assert proc.poll() is None and sandbox_processes(sleep), "the agent never started"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "run the same command to go on" in err, err[-2000:]
    assert read_records(out) == [calibrated(record(1, 0), 2)]
    assert wait_for(lambda: sandbox_processes(sleep) == [], timeout_s=30)


def test_out_in_a_folder_that_does_not_exist_yet_is_written(tmp_path: Path):
    """OUT's folder was never made: the first finished task's append failed (a traceback) after its
    rollouts had all run, and nothing was recorded (the assistant example's README command did it)."""
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "script.json").write_text(json.dumps({"turns": [{"content": "Answer: 42"}]}))
    (tmp_path / "rollout.toml").write_text(rollout_toml(tmp_path))
    write_records(tmp_path / "in.jsonl", [record(0, 1)])
    out = tmp_path / "runs" / "teacher" / "calibrated.jsonl"
    proc = subprocess.run(
        [*HARNESSRL, "data", "calibrate", str(tmp_path / "in.jsonl"), str(out)]
        + ["--config", str(tmp_path / "rollout.toml"), "--k", "1", "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["calibration"]["passes"] for r in read_records(out)] == [1]


def test_a_task_the_harness_cannot_start_on_is_refused_before_anything_starts(tmp_path: Path):
    """A harness whose command names ``{task[repo]}``, calibrated on records one of which has no
    ``repo``: each of its k rollouts used to fail at launch as an infrastructure failure (exit 0, a
    store, OUT written); now one line names the task and the field, exit 2, nothing made."""
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "script.json").write_text(json.dumps({"turns": [{"content": "Answer: 42"}]}))
    config = rollout_toml(tmp_path).replace('"{prompt}"]', '"{prompt}", "{task[repo]}"]')
    assert "{task[repo]}" in config
    (tmp_path / "rollout.toml").write_text(config)
    no_repo = {k: v for k, v in record(1, 4).items() if k != "repo"}
    src = write_records(tmp_path / "in.jsonl", [record(0, 4), no_repo])
    out = tmp_path / "out" / "out.jsonl"
    before = sorted(p.name for p in tmp_path.iterdir())
    result = calibrate_in_process(tmp_path, src, out)
    assert result.exit_code == 2, result.output
    assert "task 'owner__proj.abc.task_1': the harness cannot start on it" in result.output
    assert "{task[repo]}" in result.output and "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no run folder, no OUT (nor its folder)


def test_calibrate_never_runs_another_runs_queued_rollouts(tmp_path: Path):
    """The store of ``--run-dir`` (or a training config's shared ``[store]``) may hold another run's
    queued rollouts: calibrate's controller used to claim them too and finish them under its own
    engine (the base policy, its own sampling). It runs only its own now, under a run id of its own."""
    from harnessrl.store import open_store

    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "script.json").write_text(json.dumps({"turns": [{"content": "Answer: 42"}]}))
    (tmp_path / "rollout.toml").write_text(rollout_toml(tmp_path))
    (tmp_path / "run").mkdir()
    store = open_store(str(tmp_path / "run" / "harnessrl.db"))
    try:
        task = {"prompt": "Task 9: reply with the answer.", "solve_k": 4, "hidden": {"answer": "42"}}
        store.create_rollout(task=task, rollout_id="other-g000001-r0", run_id="other")
    finally:
        store.close()
    src = write_records(tmp_path / "in.jsonl", [record(0, 4)])
    result = calibrate_in_process(tmp_path, src, tmp_path / "out.jsonl")
    assert result.exit_code == 0, result.output
    assert read_records(tmp_path / "out.jsonl")[0]["calibration"]["passes"] == 4
    store = open_store(str(tmp_path / "run" / "harnessrl.db"))
    try:
        other = store.get_rollout("other-g000001-r0")
        assert (other.status.value, other.worker_id, other.attempt) == ("queued", None, 0)
        own = [r for r in store.list_rollouts() if r.rollout_id.startswith("cal-")]
        assert len(own) == 4 and len({r.run_id for r in own}) == 1
        assert own[0].run_id is not None and own[0].run_id.startswith("calibrate-")
    finally:
        store.close()


def test_a_batch_waits_for_the_evaluator_and_the_audit_of_every_attempt(tmp_path: Path):
    """The batch limit counted ``harness.timeout_s`` only: with a quick harness and an evaluator that
    may take minutes (a SWE task's test suite), a batch being scored was cut off as timed out."""
    from harnessrl.cli.rollout import load_rollout_config
    from harnessrl.data.calibrate import _batch_timeout

    (tmp_path / "script.json").write_text(json.dumps({"turns": [{"content": "Answer: 42"}]}))
    toml = rollout_toml(tmp_path).replace("timeout_s = 60", "timeout_s = 1")
    toml = toml.split("[evaluator]")[0] + (
        '[evaluator]\ntype = "command"\nreward_from = "exit_code"\ncommand = ["true"]\ntimeout_s = 300\n\n'
        "[controller]\nconcurrency = 4\nmax_infra_retries = 1\n"
    )
    (tmp_path / "rollout.toml").write_text(toml)
    config = load_rollout_config(str(tmp_path / "rollout.toml"), [])
    attempt_s = 1 + 300 + config.controller.audit.max_seconds
    assert _batch_timeout(config, 4) >= 2 * attempt_s  # one wave of 4, two attempts each
    assert _batch_timeout(config, 8) >= 2 * _batch_timeout(config, 4) - 1  # two waves
