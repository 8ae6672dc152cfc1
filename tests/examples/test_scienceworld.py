"""The ScienceWorld example for real: the task source over the environment's own splits, the replay
evaluator (reward from the simulator, not from the agent), the unmodified agent playing a known-good
action sequence through the gateway with the scripted engine, and two optimizer steps of
``harnessrl train examples/scienceworld/train.toml`` on the tiny model.

Needs ``pip install scienceworld`` and Java 17; skipped without them, except under CI=true (CI
installs both, so a missing one there is a failure, not a skip).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.errors import ConfigError
from harnessrl.schemas import Call

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "scienceworld"
HARNESSRL = [sys.executable, "-m", "harnessrl"]

TASK = "find-non-living-thing"
VARIATION = 0
SIMPLE = "easy"
# One of ScienceWorld's gold paths for this variation (env.get_gold_action_sequence()), with the score
# after each prefix: 8, 25, 25, 75, 100.
GOLD = [
    "open door to kitchen",
    "go to kitchen",
    "look around",
    "focus on painting",
    "move painting to red box",
]


def _missing() -> str | None:
    try:
        import scienceworld  # noqa: F401
    except ImportError:
        return "scienceworld is not installed (.venv/bin/pip install scienceworld)"
    if shutil.which("java") is None:
        return "no java on PATH (ScienceWorld needs Java 17)"
    return None


@pytest.fixture(scope="module")
def scienceworld_available():
    reason = _missing()
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI installs ScienceWorld, but: {reason}")
        pytest.skip(reason)


needs_scienceworld = pytest.mark.usefixtures("scienceworld_available")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")


def _call(seq: int, text: str) -> Call:
    """A recorded chat-completions call whose reply is ``text`` (token ids are irrelevant here)."""
    return Call(
        rollout_id="r",
        seq=seq,
        response={"choices": [{"message": {"role": "assistant", "content": text}}]},
        prompt_token_ids=[1],
        response_token_ids=[2],
        response_logprobs=[0.0],
    )


def _workspace(tmp_path: Path, actions: list[str], claimed: int = 0) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "scienceworld_actions.json").write_text(json.dumps({"actions": actions, "score": claimed}))
    return ws


def _task(max_steps: int = 10) -> dict:
    return {"task_name": TASK, "variation": VARIATION, "simplifications": SIMPLE, "max_steps": max_steps}


# -- task source -------------------------------------------------------------------------------------


@needs_scienceworld
def test_task_source_enumerates_variations_from_scienceworld_splits():
    from harnessrl.tasks.scienceworld import scienceworld_tasks
    from harnessrl.trainer.task_sources import ScienceWorldTasks

    train = scienceworld_tasks(
        [TASK], variations="train", size=3, seed=0, simplifications=SIMPLE, max_steps=5
    )
    again = scienceworld_tasks(
        [TASK], variations="train", size=3, seed=0, simplifications=SIMPLE, max_steps=5
    )
    dev = scienceworld_tasks([TASK], variations="dev", size=3, seed=0, split="heldout")
    assert [t.task_id for t in train] == [t.task_id for t in again]  # deterministic
    assert len(train) == len(dev) == 3
    task = train[0]
    assert task.task_id == f"sw-{TASK}-easy-v{task.data['variation']}"
    assert (
        task.data["task_name"] == TASK and task.data["max_steps"] == 5 and task.data["variations"] == "train"
    )
    assert task.data["prompt"].startswith("Your task is to find a(n) non-living thing")
    # ScienceWorld's own splits: held-out variations are never training variations.
    assert not {t.data["variation"] for t in train} & {t.data["variation"] for t in dev}
    assert all(t.split == "heldout" for t in dev)

    # Through the trainer's [tasks] section: the same records.
    source = ScienceWorldTasks(
        type="scienceworld",
        size=3,
        seed=0,
        config={"tasks": [TASK], "simplifications": SIMPLE, "max_steps": 5},
    )
    assert [t.task_id for t in source.load(split="train")] == [t.task_id for t in train]

    with pytest.raises(ConfigError, match="unknown task"):
        scienceworld_tasks(["find-unicorn"])
    with pytest.raises(ConfigError, match="variations must be one of"):
        scienceworld_tasks([TASK], variations="validation")
    with pytest.raises(ConfigError, match="unknown simplification"):
        scienceworld_tasks([TASK], simplifications="fly")
    with pytest.raises(ConfigError, match="scienceworld config"):
        ScienceWorldTasks(type="scienceworld", config={"tasks": [TASK], "colour": "red"}).load(split="train")


# -- replay evaluator ----------------------------------------------------------------------------------


@needs_scienceworld
def test_replay_reward_comes_from_the_simulator_not_the_agent(tmp_path):
    from harnessrl.controller.evaluators import EvaluationInput, build_evaluator
    from harnessrl.tasks.scienceworld import gold_actions, replay, replay_reward

    # ScienceWorld's gold path picks one of several valid objects at random; any of them solves it.
    assert replay(TASK, VARIATION, gold_actions(TASK, VARIATION, SIMPLE), simplifications=SIMPLE).score == 100
    calls = [_call(i, f"Action: {a.upper()}.") for i, a in enumerate(GOLD)]  # decorated replies still match

    # The gold path: full score, whatever the agent claimed.
    ws = _workspace(tmp_path, GOLD, claimed=3)
    out = asyncio.run(replay_reward(EvaluationInput(task=_task(), workspace=ws, calls=calls)))
    assert out["reward"] == 1.0 and out["score"] == 100 and out["completed"] and out["agent_score"] == 3

    # A prefix is scored as the simulator scores it (partial credit), identical to a direct replay;
    # max_steps from the task cuts the log, whatever its length.
    direct = replay(TASK, VARIATION, GOLD[:2], simplifications=SIMPLE)
    assert direct.score == 25 and not direct.completed
    out = asyncio.run(replay_reward(EvaluationInput(task=_task(max_steps=2), workspace=ws, calls=calls)))
    assert out["reward"] == pytest.approx(direct.score / 100) and out["actions"] == GOLD[:2]

    # No actions at all: the starting state's score (8 with `openDoors`), as after any invalid action.
    assert replay(TASK, VARIATION, [], simplifications=SIMPLE).score == 8
    assert replay(TASK, VARIATION, ["xyzzy"], simplifications=SIMPLE).score == 8

    # A log with an action the policy never sampled scores 0 without being replayed.
    forged = tmp_path / "forged"
    forged.mkdir()
    (forged / "scienceworld_actions.json").write_text(json.dumps({"actions": GOLD, "score": 100}))
    out = asyncio.run(replay_reward(EvaluationInput(task=_task(), workspace=forged, calls=calls[:3])))
    assert out["reward"] == 0.0 and out["unverified_actions"] == GOLD[3:]
    # ... nor in another order than the policy sampled them (calls are ordered by their seq).
    backwards = [_call(i, a) for i, a in enumerate(reversed(GOLD))]
    out = asyncio.run(replay_reward(EvaluationInput(task=_task(), workspace=forged, calls=backwards)))
    assert out["reward"] == 0.0

    # No log: the agent never played, which is the policy's 0 (flagged), never an infrastructure
    # failure the policy could pick by deleting the log (that one is retried and left out).
    empty = tmp_path / "empty"
    empty.mkdir()
    out = asyncio.run(replay_reward(EvaluationInput(task=_task(), workspace=empty, calls=calls)))
    assert out["reward"] == 0.0 and out["flags"] == ["action_log_missing"]
    evaluator = build_evaluator(
        {"type": "python", "function": "harnessrl.tasks.scienceworld:replay_reward", "timeout_s": 120}
    )
    missing = asyncio.run(evaluator.evaluate(EvaluationInput(task=_task(), workspace=empty, calls=calls)))
    assert missing.reward == 0.0 and "action_log_missing" in missing.flags, missing
    result = asyncio.run(evaluator.evaluate(EvaluationInput(task=_task(), workspace=ws, calls=calls)))
    assert result.reward == 1.0 and result.details["score"] == 100


def test_agent_parse_action_keeps_the_action_a_substring_of_the_reply():
    spec = importlib.util.spec_from_file_location("scienceworld_example_agent", EXAMPLE / "agent.py")
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)  # imports openai only; scienceworld is imported in main()
    parse_action = agent.parse_action
    assert parse_action("Action: Open door to kitchen.") == "open door to kitchen"
    assert parse_action("<think>hmm</think>\n\n> `look around`\nthen more") == "look around"
    assert parse_action("   \n") == ""
    assert parse_action("0") == "0"  # answering ScienceWorld's "Ambiguous request" menu


# -- end to end ----------------------------------------------------------------------------------------


@needs_scienceworld
@needs_root
def test_scripted_agent_plays_the_gold_path_and_the_reward_matches_a_direct_replay(tmp_path):
    """The unmodified agent in its sandbox, the real gateway and controller; the scripted engine
    plays the gold path with decorations and an invalid action the environment rejects."""
    from harnessrl.store.sqlite import SQLiteStore
    from harnessrl.tasks.scienceworld import replay

    turns = ["open door to kitchen", "Action: go to kitchen", "xyzzy", "look around", "focus on painting",
             "move painting to red box."]  # fmt: skip
    (tmp_path / "script.json").write_text(json.dumps({"turns": turns, "on_exhausted": "repeat_last"}))
    (tmp_path / "rollout.toml").write_text(
        f"""
[engine]
model = "scripted:script.json"
[harness]
preset = "python"
command = ["{EXAMPLE / "agent.py"}"]
timeout_s = 300
[evaluator]
type = "python"
function = "harnessrl.tasks.scienceworld:replay_reward"
timeout_s = 300
"""
    )
    task = {"prompt": "find a non-living thing", **_task(max_steps=8)}
    proc = subprocess.run(
        [*HARNESSRL, "rollout", "--config", "rollout.toml", "--run-dir", "run", "--task", json.dumps(task)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["status"] == "finished" and summary["outcome"] == "success", summary
    assert summary["calls"] == len(turns)  # the task ended on the last action: no extra call

    store = SQLiteStore(tmp_path / "run" / "harnessrl.db")
    rollout = store.get_rollout(summary["rollout_id"])
    store.close()
    evaluation = rollout.metadata["evaluation"]
    actions = ["open door to kitchen", "go to kitchen", "xyzzy", "look around", "focus on painting",
               "move painting to red box"]  # fmt: skip
    assert evaluation["actions"] == actions
    direct = replay(TASK, VARIATION, actions, simplifications=SIMPLE)
    assert summary["reward"] == rollout.reward == direct.score / 100 == 1.0
    assert evaluation["agent_score"] == evaluation["score"] == 100  # the agent saw what the replay saw


@needs_scienceworld
@needs_root
@pytest.mark.slow
def test_train_two_steps_on_the_tiny_model(tmp_path):
    """``harnessrl train`` on the example config, shrunk: 2 optimizer steps of 1 task x 2 rollouts,
    3 turns each, plus one held-out rollout; rewards come from the replay evaluator."""
    from harnessrl.store.sqlite import SQLiteStore

    run_dir = tmp_path / "run"
    sets = {
        "run.dir": str(run_dir),
        "engine.model": "tiny",
        "metrics.progress": "false",
        "trainer.steps": "2",
        "trainer.tasks_per_step": "1",
        "trainer.group_size": "2",
        "trainer.eval_every": "2",
        "tasks.size": "2",
        "tasks.config.max_steps": "3",
        "heldout.size": "1",
        "heldout.config.max_steps": "3",
        "controller.concurrency": "4",
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    proc = subprocess.run(
        [*HARNESSRL, "train", str(EXAMPLE / "train.toml"), *args], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("reward/mean") is not None]
    assert [r["step"] for r in steps] == [1, 2]
    for row in steps:
        assert 0.0 <= row["reward/mean"] <= 1.0
        assert 1.0 <= row["trajectory/samples_per_rollout"] <= 3.0  # at most one sample per turn
    assert any(r.get("heldout/reward") is not None for r in rows)
    state = json.loads((run_dir / "checkpoints" / "latest" / "harnessrl_state.json").read_text())
    assert state["step"] == 2

    store = SQLiteStore(run_dir / "harnessrl.db")
    trained = [
        r for r in store.list_rollouts(run_id="scienceworld-smollm2") if r.metadata.get("trained_at_step")
    ]
    assert len(trained) == 2 * 1 * 2
    for rollout in trained:
        evaluation = rollout.metadata["evaluation"]
        assert 0.0 <= rollout.reward <= 1.0
        assert rollout.reward == max(evaluation["score"], 0) / 100  # the replay's score, nothing else
        assert len(evaluation["actions"]) <= 3
        assert 1 <= len(store.list_calls(rollout.rollout_id)) <= 3
    store.close()


def test_example_configs_validate():
    """Both configs parse and validate (no GPU, no JVM): the GPU one is documented, not run here."""
    from harnessrl.config import load_raw_config, resolve_relative_paths, validate_config
    from harnessrl.trainer.config import TrainConfig

    for name, device in (("train.toml", "cpu"), ("train_gpu.toml", "cuda")):
        path = EXAMPLE / name
        config = validate_config(TrainConfig, resolve_relative_paths(load_raw_config(str(path), []), EXAMPLE))
        assert config.tasks.type == config.heldout.type == "scienceworld"
        assert config.tasks.config["variations"] == "train" and config.heldout.config["variations"] == "dev"
        assert config.evaluator.function == "harnessrl.tasks.scienceworld:replay_reward"
        assert config.engine.device == device
        assert config.harness.command[0] == str(EXAMPLE / "agent.py")
