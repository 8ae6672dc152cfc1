"""A tool call whose arguments nest JSON past the parser's depth (``[[[...]]]`` 3,000 deep: a few
hundred tokens of the policy's) made the audit's ``json.loads`` raise ``RecursionError``: the
controller recorded "controller error: RecursionError", an infrastructure failure, and the policy's
0 left its group's baseline. Now such arguments are read as free-form text, like malformed JSON.
The real controller, store, sandboxed harness and command evaluator; the attack beside its control."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from harnessrl.controller.audit import audit_rollout
from harnessrl.controller.audit.extract import extract_commands
from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.controller import Controller, ControllerConfig, GatewayEndpoint
from harnessrl.controller.evaluators import build_evaluator
from harnessrl.controller.local import LocalRunner
from harnessrl.schemas import Call, RolloutStatus
from harnessrl.store.sqlite import SQLiteStore

DEEP = 3000
SHALLOW = 100


def nested_call(rollout_id: str, depth: int) -> Call:
    arguments = '{"command": "cat /etc/hostname", "pad": ' + "[" * depth + "]" * depth + "}"
    return Call(
        rollout_id=rollout_id,
        attempt=0,
        prompt_token_ids=[1],
        response_token_ids=[2],
        response_logprobs=[0.0],
        request={"messages": []},
        response={
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": arguments}}
            ],
        },
    )


@pytest.mark.parametrize("depth", [DEEP, SHALLOW])
def test_the_audit_reads_nested_arguments(depth):
    """Parsed (the control), or read as text: either way the command in them is audited."""
    [record] = extract_commands([nested_call("r", depth)])
    assert record.kind == "shell" and "cat /etc/hostname" in record.text
    report = audit_rollout([nested_call("r", depth)])
    assert report.commands_checked == 1
    json.dumps(report.model_dump())  # a report the controller can store


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")
@pytest.mark.parametrize("depth", [DEEP, SHALLOW])
def test_nested_arguments_are_the_policys_outcome(tmp_path, depth):
    store = SQLiteStore(tmp_path / "db.sqlite")
    rid = store.create_rollout(task={}).rollout_id
    store.add_call(nested_call(rid, depth))
    controller = Controller(
        store,
        LocalRunner(bridge_path=None),
        gateway=GatewayEndpoint("127.0.0.1", 9),
        harness=HarnessSpec(command=["true"], timeout_s=60, sandbox="bwrap"),
        evaluator=build_evaluator({"type": "command", "command": ["sh", "-c", "exit 1"]}),
        run_dir=tmp_path / "run",
        config=ControllerConfig(poll_interval_s=0.1, max_infra_retries=0),
    )

    async def go():  # noqa: ANN202
        [rollout] = await controller.run_until_done([rid], timeout_s=120)
        await controller.shutdown()
        return rollout

    rollout = asyncio.run(go())
    store.close()
    assert rollout.status is RolloutStatus.FINISHED, rollout.error
    assert rollout.reward == 0.0 and rollout.attempt == 0
