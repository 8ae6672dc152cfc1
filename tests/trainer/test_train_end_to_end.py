"""``harnessrl train`` for real, on the tiny model: a real harness process (a stdlib HTTP agent) through
the real gateway and controller, optimizer steps that measurably raise the reward, checkpoints that
load in transformers, and ``--resume`` after SIGKILL that neither re-trains nor loses rollouts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.fakes.processes import processes_running

from harnessrl.schemas import RolloutStatus
from harnessrl.store.sqlite import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "tiny" / "train.toml"
HARNESSRL = [sys.executable, "-m", "harnessrl"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")


def train(run_dir: Path, *extra: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            *HARNESSRL,
            "train",
            str(CONFIG),
            "--set",
            f"run.dir={run_dir}",
            "--set",
            "metrics.progress=false",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


#: Steps of the reward test, the example's 12. Nine would save ~30 s of a CI run (each step costs 64
#: rollouts, ~10 s here) and four runs rose enough by step 8 (+0.16 to +0.50, the bar below is +0.1),
#: but the slowest gained +0.21 in 9 steps: too thin a margin for a test whose flake stops a whole CI run.
REWARD_STEPS = 12


def test_reward_goes_up_and_checkpoint_loads(tmp_path):
    run_dir = tmp_path / "run"
    # Groups of 16, not the example's 8: at lr 3e-2 the policy soon collapses onto one answer and a
    # group without variance teaches nothing more; with 8 samples a CI run collapsed onto a 3/7-vowel
    # answer (+0.098, the bar below is +0.1) and runs here on 0.43-0.5 (+0.10-0.17) under load; with
    # 16, three runs under load settled on 0.56-0.67 (+0.23-0.34).
    proc = train(run_dir, "--set", "trainer.group_size=16", "--set", f"trainer.steps={REWARD_STEPS}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["steps"] == REWARD_STEPS
    rows = [r for r in metrics(run_dir) if r.get("reward/mean") is not None]
    assert [r["step"] for r in rows] == list(range(1, REWARD_STEPS + 1))
    rewards = [r["reward/mean"] for r in rows]
    # A random policy gets ~0.32 (step-to-step noise ~0.02); the example's learning rate makes it
    # settle on vowel-heavy tokens (0.5-0.6) within about five steps.
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.1, rewards
    assert all(r["trajectory/samples_per_rollout"] == 1.0 for r in rows)

    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(summary["final_checkpoint"])
    out = model(torch.tensor([[1, 2, 3]])).logits
    assert out.shape[:2] == (1, 3) and torch.isfinite(out).all()

    store = SQLiteStore(run_dir / "harnessrl.db")
    versions = [v.version for v in store.list_policy_versions()]
    assert versions == list(range(1, REWARD_STEPS + 1))
    # Calls carry the policy version that sampled them; later groups saw newer policies.
    trained = [r for r in store.list_rollouts(run_id="tiny-vowels") if r.metadata.get("trained_at_step")]
    assert len(trained) == REWARD_STEPS * 4 * 16  # steps x tasks x the group of 16 above
    assert max(c.policy_version for c in store.list_calls(trained[-1].rollout_id)) >= REWARD_STEPS - 2
    store.close()


#: Steps of the SIGKILL test, killed once 3 are logged: 3 more to resume. It was 8; the 2 more steps
#: (32 rollouts each) proved nothing about resuming that the 3 do not.
RESUME_STEPS = 6


def test_resume_after_sigkill_continues_without_retraining(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [
        *HARNESSRL,
        "train",
        str(CONFIG),
        "--set",
        f"run.dir={run_dir}",
        "--set",
        "metrics.progress=false",
        "--set",
        f"trainer.steps={RESUME_STEPS}",
    ]
    # SIGKILL leaves the run's temp folders (the gateway bridge's socket, the sandbox's) where the
    # child made them: its own TMPDIR keeps them in this test's folder, not in /tmp.
    temp = tmp_path / "t"
    temp.mkdir()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        path = run_dir / "metrics.jsonl"
        if path.exists() and len(path.read_text().splitlines()) >= 3:
            break
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert {p.name.split("-")[0] for p in temp.iterdir()} >= {"hrl"}  # what /tmp would have kept
    steps_before = [r["step"] for r in metrics(run_dir)]

    again = train(run_dir, "--set", f"trainer.steps={RESUME_STEPS}")  # without --resume: refused
    assert again.returncode == 2 and "--resume" in again.stderr

    resumed = subprocess.run(
        [*HARNESSRL, "train", "--resume", str(run_dir), "--set", "metrics.progress=false"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["steps"] == RESUME_STEPS

    state = json.loads((run_dir / "checkpoints" / "latest" / "harnessrl_state.json").read_text())
    assert state["step"] == RESUME_STEPS
    assert len(state["consumed_groups"]) == len(set(state["consumed_groups"])) == RESUME_STEPS * 4
    steps_after = [r["step"] for r in metrics(run_dir)]
    # Steps logged after the restart continue from the checkpoint: nothing past it is done twice.
    resumed_steps = steps_after[len(steps_before) :]
    assert resumed_steps == list(range(resumed_steps[0], RESUME_STEPS + 1))
    assert resumed_steps[0] <= steps_before[-1] + 1

    store = SQLiteStore(run_dir / "harnessrl.db")
    rollouts = store.list_rollouts(run_id="tiny-vowels")
    consumed = set(state["consumed_groups"])
    for group in consumed:
        members = [r for r in rollouts if r.group_id == group]
        assert len(members) == 8 and all(r.status.value in ("finished", "failed") for r in members)
    assert not [r for r in rollouts if r.status.value == "running"]
    store.close()


def resume_to(run_dir: Path, steps: int) -> subprocess.CompletedProcess:
    argv = [*HARNESSRL, "train", "--resume", str(run_dir), "--set", "metrics.progress=false"]
    return subprocess.run(
        argv + ["--set", f"trainer.steps={steps}"], capture_output=True, text=True, timeout=600
    )


def test_resume_past_a_finished_run_rewrites_the_final_checkpoint(tmp_path):
    # checkpoints/final used to be written only if missing: resumed from 2 to 3 steps, it kept step 2.
    from safetensors.torch import load_file

    run_dir = tmp_path / "run"
    short = ("--set", "trainer.steps=2", "--set", "trainer.eval_every=0")
    first = train(run_dir, *short)
    assert first.returncode == 0, first.stderr[-3000:]
    # The run folder is announced first, the closing lines say what to run next, and transformers'
    # weight-loading bars stay out of a log that is not a terminal.
    assert first.stderr.startswith(f"harnessrl: training in {run_dir}")
    assert f"dashboard:   harnessrl dashboard --run-dir {run_dir}" in first.stderr
    assert "Loading weights" not in first.stderr and "Writing model shards" not in first.stderr
    final = run_dir / "checkpoints" / "final"
    assert json.loads((final / "harnessrl_final.json").read_text()) == {"step": 2}
    at_two = load_file(final / "model.safetensors")
    resumed = resume_to(run_dir, 3)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["steps"] == 3
    assert json.loads((final / "harnessrl_final.json").read_text()) == {"step": 3}
    at_three = load_file(final / "model.safetensors")
    latest = load_file(run_dir / "checkpoints" / "latest" / "model.safetensors")
    assert all((at_three[k] == latest[k]).all() for k in latest)  # final = the last step's weights
    assert any((at_three[k] != at_two[k]).any() for k in at_two)  # and not the first run's
    # --resume of a finished run trains nothing and says how to extend it.
    rows = len(metrics(run_dir))
    again = resume_to(run_dir, 3)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already finished its 3 steps" in again.stderr and "--set trainer.steps=13" in again.stderr
    assert json.loads(again.stdout.strip().splitlines()[-1])["already_finished"] is True
    assert len(metrics(run_dir)) == rows


def test_a_step_that_failed_before_the_policy_was_sampled_stops_the_run_and_resume_skips_it(tmp_path):
    # The harness starts but dies at once, the same way every time (a dependency it cannot import):
    # every rollout used to be a policy_failure with reward 0 and the run "trained" on.
    run_dir = tmp_path / "run"
    broken = """harness.command=["-c", "import sys; sys.exit('ModuleNotFoundError: No module named openai_fake')"]"""
    first = train(run_dir, "--set", broken, "--set", "trainer.eval_every=0")
    assert first.returncode == 2, first.stderr[-3000:]
    assert "step 1: all 32 rollouts of the step failed the same way" in first.stderr
    assert "exit code 1" in first.stderr and "No module named openai_fake" in first.stderr
    assert f"harnessrl train --resume {run_dir}" in first.stderr and "Traceback" not in first.stderr
    assert not (run_dir / "metrics.jsonl").exists()  # nothing was trained
    store = SQLiteStore(run_dir / "harnessrl.db")
    try:
        assert store.get_run("tiny-vowels").status == "stopped"
        stopped = {
            r.group_id for r in store.list_rollouts(run_id="tiny-vowels") if r.metadata.get("stopped_run")
        }
        assert len(stopped) == 4
    finally:
        store.close()
    # Fixed on resume: the step trains on new groups, none of the ones that failed before.
    agent = CONFIG.parent / "agent.py"
    fixed = subprocess.run(
        [*HARNESSRL, "train", "--resume", str(run_dir), "--set", f'harness.command=["{agent}", "{{prompt}}"]',
         "--set", "trainer.steps=1", "--set", "metrics.progress=false"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    store = SQLiteStore(run_dir / "harnessrl.db")
    try:
        trained = {
            r.group_id for r in store.list_rollouts(run_id="tiny-vowels") if "trained_at_step" in r.metadata
        }
        assert len(trained) == 4 and not trained & stopped
    finally:
        store.close()


#: ``trainer.rollout_deadline_s`` of the hang test: the test waits it out, so it is short, but the healthy
#: rollouts must end inside it on a loaded machine too. They took 2.0-2.1 s from start to reward here
#: at load 8-10 on 2 cores: 15 s is seven times that (it was 40 s, 25 s more of the test spent waiting).
HANG_DEADLINE_S = 15


def test_a_harness_that_hangs_is_cancelled_at_the_deadline_and_counted(tmp_path):
    """Issue 35: a step never waits forever on one rollout. Every group's first rollout runs a
    harness that hangs (far past any test's patience: its own timeout is an hour); the trainer
    cancels each at ``trainer.rollout_deadline_s`` and trains on the rest."""
    agent = tmp_path / "hangs_on_r0.py"
    hang = (
        "\n    if os.environ['HARNESSRL_ROLLOUT_ID'].endswith('-r0'):\n        __import__('time').sleep(3600)"
    )
    main = 'if __name__ == "__main__":'
    agent.write_text((CONFIG.parent / "agent.py").read_text().replace(main, main + hang))
    agent.chmod(0o755)
    run_dir = tmp_path / "run"
    proc = train(
        run_dir,
        "--set", f'harness.command=["{agent}", "{{prompt}}"]',
        "--set", "harness.timeout_s=3600",
        "--set", f"trainer.rollout_deadline_s={HANG_DEADLINE_S}",
        "--set", "trainer.mode=sync",
        "--set", "trainer.steps=1",
        "--set", "trainer.tasks_per_step=2",
        "--set", "trainer.group_size=3",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = [r for r in metrics(run_dir) if "rollouts/total" in r]
    assert row["rollouts/total"] == 6 and row["rollouts/cancelled_stuck"] == 2
    assert row["rollouts/trained"] == 4 and row["rollouts/no_reward"] == 2
    store = SQLiteStore(run_dir / "harnessrl.db")
    try:
        stuck = [r for r in store.list_rollouts(run_id="tiny-vowels") if r.rollout_id.endswith("-r0")]
        assert len(stuck) == 2
        for rollout in stuck:
            assert rollout.status.value == "cancelled" and rollout.reward is None
            assert rollout.metadata["cancelled_stuck"]["deadline_s"] == HANG_DEADLINE_S
            # Cancelled once it ran past the deadline; recorded to 0.1 s, so 15.03 s reads 15.0.
            assert rollout.metadata["cancelled_stuck"]["running_s"] >= HANG_DEADLINE_S
    finally:
        store.close()
    assert processes_running(str(agent)) == []  # nothing of the run is left running


@contextlib.contextmanager
def children_start_with_sigint(disposition: signal.Handlers) -> Iterator[None]:
    """Processes started inside the block begin with SIGINT at ``disposition``: ``SIG_DFL`` (what
    a terminal gives) or ``SIG_IGN`` (what a background job of a non-interactive shell gets, e.g.
    ``cmd &`` in a script or ``nohup``). Only "ignored" survives exec, so the default is asked for
    by catching SIGINT here meanwhile (exec resets a caught signal to its default action). Without
    this, a test run started in the background passes its ignored SIGINT on to ``harnessrl train``,
    which keeps it ignored (as documented), and the SIGINT test waits for nothing: that is how two
    fresh-clone CI runs, started with ``setsid nohup ... &``, hung in it."""
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(
        signal.SIGINT, signal.SIG_IGN if disposition is signal.SIG_IGN else signal.default_int_handler
    )
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def signals_in(pid: int, field: str) -> set[int]:
    """The signals in ``/proc/PID/status``'s ``field`` mask (``SigIgn``: ignored, ``SigCgt``: caught)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask >> (n - 1) & 1}
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def start_slow_run(tmp_path: Path, sigint: signal.Handlers) -> tuple[subprocess.Popen, Path, Path]:
    """``harnessrl train`` on the tiny example with an agent that sleeps for 10 minutes, started with
    SIGINT at ``sigint``; returns once at least 4 of its harnesses run (signals now find rollouts in
    flight)."""
    agent = tmp_path / "slow_agent.py"
    agent.write_text("import time\ntime.sleep(600)\n")
    run_dir = tmp_path / "run"
    with children_start_with_sigint(sigint):
        proc = subprocess.Popen(
            [*HARNESSRL, "train", str(CONFIG), "--set", f"run.dir={run_dir}", "--set", "metrics.progress=false",
             "--set", f'harness.command=["{agent}"]'],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # SIGABRT makes it print every thread's stack
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while len(processes_running(str(agent))) < 4:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the harnesses never started"
            time.sleep(0.2)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return proc, run_dir, agent


def stopped_by(proc: subprocess.Popen, *signums: int) -> str:
    """Send ``signums`` in order; return the run's stderr once it exited. A run still going 90 s
    later is made to print every thread's stack (SIGABRT with faulthandler) and fails the test."""
    try:
        for signum in signums:
            proc.send_signal(signum)
        try:
            return proc.communicate(timeout=90)[1]
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=60)
            pytest.fail(
                f"still running 90 s after {[signal.Signals(s).name for s in signums]}; its threads:\n{err[-8000:]}"
            )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def assert_stopped_cleanly(proc: subprocess.Popen, err: str, signum: int, run_dir: Path, agent: Path) -> None:
    """Exit 128 + ``signum`` with the --resume line, no harness left, in-flight rollouts requeued."""
    assert proc.returncode == 128 + signum, err[-3000:]
    assert f"{signal.Signals(signum).name}: run stopped" in err
    assert f"harnessrl train --resume {run_dir}" in err
    assert processes_running(str(agent)) == []
    assert_run_stopped_and_requeued(run_dir)


def assert_run_stopped_and_requeued(run_dir: Path) -> None:
    """The run is "stopped" in its store, no rollout left running, the ones in flight queued again."""
    store = SQLiteStore(run_dir / "harnessrl.db")
    try:
        rollouts = store.list_rollouts(run_id="tiny-vowels")
        assert rollouts and not [r for r in rollouts if r.status.value == "running"]
        assert [r for r in rollouts if r.status.value == "queued"]  # taken again by --resume
        assert store.get_run("tiny-vowels").status == "stopped"
    finally:
        store.close()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_run_cleanly(tmp_path, signum):
    """Ctrl-C or SIGTERM (kill, a deleted pod) while harnesses run: every harness process is killed,
    the rollouts in flight are requeued for --resume, the run is marked stopped, and the command
    exits 128 + the signal with the --resume line."""
    proc, run_dir, agent = start_slow_run(tmp_path, signal.SIG_DFL)
    # The run catches both (its event loop's handlers), whatever this test process inherited.
    assert {signal.SIGINT, signal.SIGTERM} <= signals_in(proc.pid, "SigCgt")
    err = stopped_by(proc, signum)
    assert_stopped_cleanly(proc, err, signum, run_dir, agent)


def test_a_run_started_ignoring_sigint_keeps_ignoring_it(tmp_path):
    """A run started as a background job of a script (``harnessrl train ... &``: the shell sets
    SIGINT to ignored) is not stopped by a Ctrl-C meant for the script's foreground; SIGTERM still
    stops it the clean way. The SIGINT is sent first, so one that acted would exit 130, not 143."""
    proc, run_dir, agent = start_slow_run(tmp_path, signal.SIG_IGN)
    assert signal.SIGINT in signals_in(proc.pid, "SigIgn")
    assert signal.SIGTERM in signals_in(proc.pid, "SigCgt")
    err = stopped_by(proc, signal.SIGINT, signal.SIGTERM)
    assert "SIGINT" not in err
    assert_stopped_cleanly(proc, err, signal.SIGTERM, run_dir, agent)


def test_bad_config_names_the_field(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(CONFIG.read_text().replace("group_size = 8", "group_size = 0"))
    proc = subprocess.run(
        [*HARNESSRL, "train", str(bad), "--set", f"run.dir={tmp_path / 'r'}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "trainer.group_size" in proc.stderr


@pytest.mark.slow
def test_train_on_a_postgres_store(tmp_path):
    """``[store] url`` points a run at a shared PostgreSQL instead of the run folder's SQLite file."""
    from harnessrl.store import open_store
    from harnessrl.store.pg_server import PostgresUnavailable, server_for_tests

    try:
        server_cm = server_for_tests()
        server = server_cm.__enter__()
    except PostgresUnavailable as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(str(exc))
    try:
        url = server.create_database("train_e2e")
        run_dir = tmp_path / "run"
        proc = train(run_dir, "--set", "trainer.steps=2", "--set", f"store.url={url}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert not (run_dir / "harnessrl.db").exists()
        store = open_store(url)
        try:
            assert [v.version for v in store.list_policy_versions()] == [1, 2]
            trained = [
                r for r in store.list_rollouts(run_id="tiny-vowels") if r.metadata.get("trained_at_step")
            ]
            assert len(trained) == 2 * 4 * 8
            assert all(store.count_calls(r.rollout_id) >= 1 for r in trained)
        finally:
            store.close()
    finally:
        server_cm.__exit__(None, None, None)


def test_train_against_a_remote_vllm_engine_publishes_versioned_checkpoints(tmp_path):
    """Engine ``vllm:URL``: the trainer trains ``trainer.model``'s weights and after every step hands
    the server a Hugging Face folder through vLLM's reload call; calls carry the new version."""
    from tests.fakes.vllm_server import serve_vllm

    from harnessrl.engines.tiny import tiny_model_dir
    from harnessrl.tokenizer import PolicyTokenizer

    tok = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    reply = tok.encode("aeiou") + [tok.eos_token_id]
    with serve_vllm(reply, context_length=2048) as upstream:
        run_dir = tmp_path / "run"
        proc = train(
            run_dir,
            "--set", f"engine.model=vllm:{upstream.url}",
            "--set", "engine.tokenizer=tiny",
            "--set", "trainer.model=tiny",
            "--set", "trainer.served_weights_tolerance=0",  # the fake serves no weights
            "--set", "trainer.mode=sync",
            "--set", "trainer.steps=2",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        reloads = [body for path, body in upstream.fake.calls if path == "/collective_rpc"]
        # Training rollouts sample from the full tempered softmax the trainer recomputes (trainer.top_p).
        assert {(r["temperature"], r["top_p"]) for r in upstream.fake.requests} == {(1.0, 1.0)}
    folders = [Path(r["kwargs"]["weights_path"]) for r in reloads]
    assert [f.name for f in folders] == ["v1", "v2"]
    assert not folders[0].exists()  # replaced once the next version was loaded
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(folders[1]))

    store = SQLiteStore(run_dir / "harnessrl.db")
    try:
        by_step: dict[int, set[int]] = {}
        for r in store.list_rollouts(run_id="tiny-vowels"):
            assert r.metadata["sampling"]["top_p"] == 1.0  # forced, whatever the harness asks for
            versions = {c.policy_version for c in store.list_calls(r.rollout_id)}
            by_step.setdefault(r.metadata["trained_at_step"], set()).update(versions)
            # "step" is only ever a policy step: sync groups are created at the step before the
            # one that trains them; the group's index is its own field.
            assert r.step == r.metadata["trained_at_step"] - 1
            assert r.metadata["group"] == int(r.group_id.removeprefix("g"))
            assert "advantage" in r.metadata
        # sync: step 2's rollouts were sampled after the first update, by the reloaded servers
        assert by_step == {1: {0}, 2: {1}}
    finally:
        store.close()


def test_train_refuses_a_server_that_does_not_serve_the_trainers_weights(tmp_path):
    """Before the first rollout the trainer probes each server: the fake's logprobs are not the tiny
    model's, so the run stops naming the server instead of training off-policy."""
    from tests.fakes.vllm_server import serve_vllm

    from harnessrl.engines.tiny import tiny_model_dir
    from harnessrl.tokenizer import PolicyTokenizer

    tok = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    with serve_vllm(tok.encode("aeiou") + [tok.eos_token_id], context_length=2048) as upstream:
        proc = train(
            tmp_path / "run",
            "--set", f"engine.model=vllm:{upstream.url}",
            "--set", "engine.tokenizer=tiny",
            "--set", "trainer.model=tiny",
            "--set", "trainer.mode=sync",
        )  # fmt: skip
        reloads = [path for path, _ in upstream.fake.calls if path == "/collective_rpc"]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"the engine at {upstream.url} does not serve the trainer's weights" in proc.stderr
    assert reloads == []  # no step was trained


@pytest.mark.slow
def test_train_with_an_external_controller_on_the_shared_store(tmp_path):
    """``trainer.controllers = "external"``: the run only queues rollouts; a separately started
    ``harnessrl controller`` (given the run's own config file) launches and scores them."""
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir = tmp_path / "run"
    trainer = subprocess.Popen(
        [*HARNESSRL, "train", str(CONFIG), "--set", f"run.dir={run_dir}", "--set", "metrics.progress=false",
         "--set", "trainer.controllers=external", "--set", "trainer.mode=sync", "--set", "trainer.steps=1",
         "--set", f"gateway.port={port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    controller = None
    try:
        deadline = time.monotonic() + 180
        while True:  # the gateway answers once the run's store and engine are up
            assert trainer.poll() is None, trainer.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the run's gateway never came up"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2)
                break
            except OSError as exc:
                if getattr(exc, "code", None) is not None:  # an HTTP answer (401): it is up
                    break
                time.sleep(0.3)
        queued = SQLiteStore(run_dir / "harnessrl.db")
        try:  # the run queues the first step's rollouts; nothing launches them before the controller
            while queued.count_rollouts(run_id="tiny-vowels") < 4 * 8:
                assert trainer.poll() is None, trainer.stderr.read()[-3000:]
                assert time.monotonic() < deadline, "the run never queued its first step"
                time.sleep(0.2)
            assert queued.count_rollouts(run_id="tiny-vowels", status=RolloutStatus.QUEUED) == 4 * 8
        finally:
            queued.close()
        assert not list((run_dir / "rollouts").glob("*")) if (run_dir / "rollouts").exists() else True
        controller = subprocess.Popen(
            [*HARNESSRL, "controller", "--config", str(CONFIG), "--store", str(run_dir / "harnessrl.db"),
             "--gateway-url", f"http://127.0.0.1:{port}", "--run-dir", str(tmp_path / "controller")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        out, err = trainer.communicate(timeout=300)
        assert trainer.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1])["steps"] == 1
    finally:
        for proc in (trainer, controller):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    store = SQLiteStore(run_dir / "harnessrl.db")
    try:
        trained = [r for r in store.list_rollouts(run_id="tiny-vowels") if r.metadata.get("trained_at_step")]
        assert len(trained) == 4 * 8 and all(r.reward is not None for r in trained)
    finally:
        store.close()
    # the controller, not the run, launched the harnesses
    assert len(list((tmp_path / "controller").rglob("stdout.log"))) >= 4 * 8
    assert not (run_dir / "rollouts").exists() or not list((run_dir / "rollouts").rglob("stdout.log"))


def test_train_pauses_and_versions_every_gateway_on_its_store(tmp_path):
    """A run in front of shared inference servers, with another gateway on the run's store (no peer
    list: the store's gate): every weight update pauses that gateway too (the trainer waits for all
    to drain) and tells it the version."""
    from tests.fakes.vllm_server import serve_vllm

    from harnessrl.client import GatewayClient
    from harnessrl.config import GatewayConfig
    from harnessrl.engines.scripted import ScriptedEngine
    from harnessrl.engines.tiny import tiny_model_dir
    from harnessrl.gateway.app import create_app
    from harnessrl.gateway.server import serve_in_thread
    from harnessrl.store import open_store
    from harnessrl.tokenizer import PolicyTokenizer

    key = "hrl-admin-peer-test"
    tok = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    shared = tmp_path / "shared.db"
    other_store = open_store(str(shared))
    other_app = create_app(
        GatewayConfig(admin_key=key), other_store, ScriptedEngine(["aeiou"], tok), shared_store=True
    )
    with (
        serve_vllm(tok.encode("aeiou") + [tok.eos_token_id], context_length=2048) as upstream,
        serve_in_thread(other_app) as other_url,
    ):
        proc = train(
            tmp_path / "run",
            "--set", f"engine.model=vllm:{upstream.url}",
            "--set", "engine.tokenizer=tiny",
            "--set", "trainer.model=tiny",
            "--set", "trainer.served_weights_tolerance=0",  # the fake serves no weights
            "--set", "trainer.steps=2",
            "--set", f"gateway.admin_key={key}",
            "--set", f"store.url={shared}",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        state = GatewayClient(other_url, key).state()
        commands = other_app.state.gateway.cluster.applied
    other_store.close()
    assert commands >= 4  # (pause, resume) per update, each applied by this gateway too
    assert state["policy_version"] == 2 and state["paused"] is False
