"""The ScienceWorld replay evaluator on what the agent controls: its action log and its replies.

The action log is the agent's to write, so whatever it leaves (nothing, a directory, a FIFO, a link
to ``/dev/zero`` or to a host file, bad JSON) is the policy's 0 with a flag, never an exception
(an infrastructure failure, retried and left out of the baseline), and never blocks the
controller's event loop. These cases return before any replay and need no JVM; the controls that
replay need ``pip install scienceworld`` and Java 17 and are skipped without them.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
from pathlib import Path

import pytest
from tests.fakes.calls import answered_call, chat_call

from harnessrl.controller.evaluators import EvaluationInput, build_evaluator
from harnessrl.schemas import Call
from harnessrl.tasks.scienceworld import ACTION_LOG, unverified_actions

TASK = {"task_name": "find-non-living-thing", "variation": 0, "simplifications": "easy", "max_steps": 10}
# One of ScienceWorld's gold paths for this variation (see tests/examples/test_scienceworld.py).
GOLD = [
    "open door to kitchen",
    "go to kitchen",
    "look around",
    "focus on painting",
    "move painting to red box",
]


def _evaluator():
    return build_evaluator(
        {"type": "python", "function": "harnessrl.tasks.scienceworld:replay_reward", "timeout_s": 120}
    )


def _evaluate(workspace: Path, calls=()) -> tuple[float, dict]:
    result = asyncio.run(_evaluator().evaluate(EvaluationInput(task=TASK, workspace=workspace, calls=calls)))
    return result.reward, result.details


@pytest.fixture
def workspace(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


def _write_log(ws: Path, payload) -> None:
    (ws / ACTION_LOG).write_text(payload if isinstance(payload, str) else json.dumps(payload))


# -- a bad action log is the policy's 0, with a flag -------------------------------------------------


def test_missing_log_scores_zero_with_a_flag(workspace):
    reward, details = _evaluate(workspace)
    assert reward == 0.0 and details["flags"] == ["action_log_missing"]


@pytest.mark.parametrize(
    "payload",
    [
        "{not json",
        "\xff\xfe",
        json.dumps(["look around"]),
        json.dumps({"actions": "look around"}),
        json.dumps({"actions": ["look around", 7]}),
        json.dumps({"score": 100}),
        "[" * 100_000 + "]" * 100_000,
    ],
    ids=["not-json", "not-utf8", "a-list", "actions-a-string", "a-non-string-action", "no-actions", "deep"],
)
def test_malformed_log_scores_zero_with_a_flag(workspace, payload):
    if payload == "\xff\xfe":
        (workspace / ACTION_LOG).write_bytes(b"\xff\xfe")
    else:
        _write_log(workspace, payload)
    reward, details = _evaluate(workspace)
    assert reward == 0.0 and details["flags"] == ["action_log_invalid"]


def test_directory_in_place_of_the_log_scores_zero_with_a_flag(workspace):
    (workspace / ACTION_LOG).mkdir()
    reward, details = _evaluate(workspace)
    assert reward == 0.0 and details["flags"] == ["action_log_invalid"]


def test_oversized_log_scores_zero_with_a_flag(workspace):
    _write_log(workspace, {"actions": ["look around"] * 200_000})  # ~3 MiB
    reward, details = _evaluate(workspace)
    assert reward == 0.0 and details["flags"] == ["action_log_invalid"]


def test_symlink_to_dev_zero_is_not_followed(workspace):
    (workspace / ACTION_LOG).symlink_to("/dev/zero")
    reward, details = _evaluate(workspace)
    assert reward == 0.0 and details["flags"] == ["action_log_invalid"]


def test_symlink_to_a_host_file_is_not_read(workspace, tmp_path):
    host = tmp_path / "host_secret.json"
    host.write_text(json.dumps({"actions": ["look around"]}))
    (workspace / ACTION_LOG).symlink_to(host)
    reward, details = _evaluate(workspace, calls=[chat_call(seq=0, text="look around")])
    assert reward == 0.0 and details["flags"] == ["action_log_invalid"]
    assert "actions" not in details  # nothing of the host file made it into the details


def test_fifo_in_place_of_the_log_does_not_block_the_event_loop(workspace):
    fifo = workspace / ACTION_LOG
    os.mkfifo(fifo)
    done = threading.Event()
    rescued = []

    def rescue():
        # A reader blocked in open() on the FIFO (and with it the event loop, so the evaluator's
        # timeout_s never fires) is released by a writer: the test then fails instead of hanging.
        if not done.wait(30):
            rescued.append(True)
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    async def main():
        ticks = 0

        async def heartbeat():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        beat = asyncio.create_task(heartbeat())
        try:
            result = await _evaluator().evaluate(EvaluationInput(task=TASK, workspace=workspace))
        finally:
            done.set()
            beat.cancel()
        return result, ticks

    watchdog = threading.Thread(target=rescue, daemon=True)
    watchdog.start()
    try:
        result, ticks = asyncio.run(main())
    finally:
        done.set()
        watchdog.join()
    assert not rescued, "the evaluator blocked the event loop on the FIFO"
    assert ticks > 0  # the loop ran other work while the evaluator waited
    assert result.reward == 0.0 and result.details["flags"] == ["action_log_invalid"]


def test_valid_log_with_an_action_never_sampled_scores_zero_without_a_flag(workspace):
    """Control: a well-formed log still goes through the check against the recorded replies."""
    _write_log(workspace, {"actions": GOLD})
    reward, details = _evaluate(workspace, calls=[chat_call(seq=i, text=a) for i, a in enumerate(GOLD[:3])])
    assert reward == 0.0 and details["unverified_actions"] == GOLD[3:] and "flags" not in details


def _scienceworld_missing() -> str | None:
    try:
        import scienceworld  # noqa: F401
    except ImportError:
        return "scienceworld is not installed"
    return None if shutil.which("java") else "no java on PATH"


needs_scienceworld = pytest.mark.skipif(
    _scienceworld_missing() is not None, reason="needs ScienceWorld + Java"
)


@needs_scienceworld
def test_valid_log_scores_as_before(workspace):
    _write_log(workspace, {"actions": GOLD, "score": 3})
    reward, details = _evaluate(
        workspace, calls=[chat_call(seq=i, text=f"Action: {a}.") for i, a in enumerate(GOLD)]
    )
    assert reward == 1.0 and details["score"] == 100 and details["agent_score"] == 3
    assert "flags" not in details


# -- actions sent as tool calls verify as actions sent as text ----------------------------------------


def _tool_call(seq: int, action: str, shape: str) -> Call:
    """A recorded reply whose action is a function call's argument, in each provider's shape."""
    arguments = json.dumps({"action": action})
    response = {
        "openai": {
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": f"c{seq}",
                                "type": "function",
                                "function": {"name": "act", "arguments": arguments},
                            }
                        ],
                    }
                }
            ]
        },
        "anthropic": {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": f"t{seq}", "name": "act", "input": {"action": action}}],
        },
        "responses": {
            "output": [{"type": "function_call", "call_id": f"f{seq}", "name": "act", "arguments": arguments}]
        },
    }[shape]
    return answered_call(response, seq)


@pytest.mark.parametrize("shape", ["openai", "anthropic", "responses"])
def test_actions_sent_as_tool_calls_are_verified(shape):
    calls = [_tool_call(i, a, shape) for i, a in enumerate(GOLD)]
    assert unverified_actions(GOLD, calls) == []
    # An action the policy never produced, in text or in a call, is still unverified.
    assert unverified_actions([*GOLD[:2], "focus on unicorn"], calls) == ["focus on unicorn"]
    assert unverified_actions(GOLD, calls[:3]) == GOLD[3:]


def test_the_tool_calls_request_side_is_not_the_policys_text():
    """Only the reply counts: the tool's description in the request is not something it produced."""
    call = _tool_call(0, "look around", "openai")
    call = call.model_copy(
        update={"request": {"tools": [{"function": {"description": "e.g. focus on painting"}}]}}
    )
    assert unverified_actions(["focus on painting"], [call]) == ["focus on painting"]


@needs_scienceworld
@pytest.mark.parametrize("shape", ["openai", "anthropic", "responses"])
def test_gold_path_played_through_tool_calls_scores_1(workspace, shape):
    _write_log(workspace, {"actions": GOLD, "score": 100})
    reward, details = _evaluate(workspace, calls=[_tool_call(i, a, shape) for i, a in enumerate(GOLD)])
    assert reward == 1.0 and details["score"] == 100 and "unverified_actions" not in details


@pytest.mark.parametrize("shape", ["openai", "responses"])
def test_an_action_with_a_lone_surrogate_is_the_policys_zero(workspace, shape):
    """JSON's ``\\ud800`` in the log is a lone surrogate, which py4j cannot send to the simulator:
    the replay raised (``Py4JError``) and the rollout was an infrastructure failure, retried and left
    out of the baseline. The policy's tool-call arguments can hold the same escape, so the action
    was verified against its replies. Now such a log is invalid: 0 with a flag, before any replay."""
    actions = ["look around", "open door to \ud800"]
    _write_log(workspace, {"actions": actions})  # json.dumps writes the escape
    calls = [_tool_call(i, a, shape) for i, a in enumerate(actions)]
    assert unverified_actions(actions, calls) == []  # the policy "sampled" it
    reward, details = _evaluate(workspace, calls=calls)
    assert reward == 0.0 and details["flags"] == ["action_log_invalid"]
    assert "lone surrogate" in details["error"]
