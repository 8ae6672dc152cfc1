"""What the general-purpose assistants' own machinery does to a rollout's token chain.

The matrix (``test_matrix.py``) shows the plain shell task. Hermes Agent and OpenClaw also carry
subagents, memory, skills and a tool-search indirection; each case here makes the scripted policy use
one of them through the real harness, then states how many samples the trajectory builder makes of
the rollout and *why* — so a change in the harness (or in the gateway's chain matching) that adds or
removes a break shows up as a failing test, not as silently shorter samples.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tests.harnesses.test_matrix import DONE, WRITE, harness_or_skip, rollout_did_the_task, tool_turn

from harnessrl.trajectory import build_batch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here"),
]

OPENCLAW_CONTEXT = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"
CHILD_ANSWER = "hello.txt is written."


@dataclass(frozen=True)
class Breaker:
    """A scripted rollout through one harness and the chain it must leave behind."""

    id: str
    preset: str
    turns: list[Any]
    samples: int
    breaks: dict[str, int]
    env: dict[str, str] = field(default_factory=dict)


CASES = [
    # delegate_task starts a subagent: a fresh conversation (its own system prompt, a smaller tool
    # set, no parent history) whose calls go through the same rollout key. `hermes -z` runs it
    # synchronously: the parent waits, the subagent's calls come between the parent's two, and its
    # answer comes back as the delegate_task result. The parent's calls still extend each other, so
    # the rollout is two samples: the parent's chain and the subagent's. (`hermes chat -q` ran it in
    # the background and interrupted it when the parent's turn ended: a race, see the preset.)
    Breaker(
        "hermes-delegate_task",
        "hermes",
        [
            tool_turn("delegate_task", goal="Create hello.txt containing hi in the current folder."),
            tool_turn("terminal", command=WRITE),  # the subagent's first call
            CHILD_ANSWER,  # the subagent's answer, returned to the parent
            DONE,  # the parent's last call
        ],
        samples=2,
        breaks={"new_context": 1},
    ),
    # Memory is injected into the system prompt once, at session start (a frozen snapshot), and the
    # preset's fixed config (memory_enabled: false; `hermes -z` has no --ignore-rules) switches that
    # injection and the store off: the tool answers an error and no prompt changes. One sample. Each
    # attempt starts from an empty $HOME/.hermes, so nothing one rollout memorises can leak into another.
    Breaker(
        "hermes-memory",
        "hermes",
        [
            tool_turn("memory", action="add", target="memory", content="Write files with printf."),
            tool_turn("terminal", command=WRITE),
            DONE,
        ],
        samples=1,
        breaks={},
    ),
    # skill_manage writes a new SKILL.md into $HOME/.hermes/skills; the skills index in the system
    # prompt is a snapshot taken at session start, so the running conversation is not rewritten.
    Breaker(
        "hermes-skill_manage",
        "hermes",
        [
            tool_turn(
                "skill_manage",
                action="create",
                name="write-hello",
                content="---\nname: write-hello\ndescription: Write hello.txt\n---\nRun printf 'hi\\n' > hello.txt\n",
            ),
            tool_turn("terminal", command=WRITE),
            DONE,
        ],
        samples=1,
        breaks={},
    ),
    # tool_search / tool_call: the 41 tools behind the indirection are found and called through
    # fixed tools, so the tool list (and the prompt's start) never changes. The chain breaks at every
    # call anyway, for OpenClaw's transient context message (see test_matrix.py): samples = calls.
    Breaker(
        "openclaw-tool_search",
        "openclaw",
        [
            tool_turn("tool_search", query="run a shell command"),
            tool_turn("tool_call", id="exec", args={"command": WRITE}),
            DONE,
        ],
        samples=3,
        breaks={"new_context": 2},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_what_breaks_the_chain(case: Breaker, tmp_path: Path) -> None:
    harness_or_skip(case.preset)
    summary, rollout, calls = rollout_did_the_task(case, tmp_path, case.id)
    log = Path(summary["log"])
    stats = build_batch([(rollout, calls)]).stats
    report = {"case": case.id, "samples": stats.samples, "breaks": dict(stats.breaks)}
    print(f"\nCHAIN-BREAKERS {json.dumps(report)}")
    assert stats.samples == case.samples, report
    assert dict(stats.breaks) == case.breaks, report
    assert stats.loss_tokens == sum(len(c.response_token_ids) for c in calls), report

    requests = [c.request for c in calls]
    tool_names = [sorted(t["function"]["name"] for t in r.get("tools", [])) for r in requests]
    if case.id == "hermes-delegate_task":
        # Synchronous, so the same order on every run: the parent's first call, the subagent's two
        # (the tools without delegate_task, its own system prompt, the goal as its task), the
        # parent's last.
        assert ["delegate_task" in names for names in tool_names] == [True, False, False, True], tool_names
        parent, child = [requests[0], requests[3]], [requests[1], requests[2]]
        assert tool_names[3] == tool_names[0] and tool_names[2] == tool_names[1]
        assert child[0]["messages"][0] != parent[0]["messages"][0]
        goal = case.turns[0]["tool_calls"][0]["arguments"]["goal"]
        assert [(m["role"], m["content"]) for m in child[0]["messages"][1:]] == [("user", goal)]
        assert child[1]["messages"][:2] == child[0]["messages"]
        # The parent's last call is its first, its delegate_task call and, as that call's result,
        # the subagent's answer: the subagent wrote the file, and the parent is told so.
        first, last = parent[0]["messages"], parent[1]["messages"]
        assert last[: len(first)] == first
        assert [m["role"] for m in last[len(first) :]] == ["assistant", "tool"]
        [result] = json.loads(last[-1]["content"])["results"]
        assert result["status"] == "completed" and result["summary"] == CHILD_ANSWER, result
        assert [t["tool"] for t in result["tool_trace"]] == ["terminal"], result
    elif case.preset == "hermes":
        system = [r["messages"][0] for r in requests]
        assert system == [system[0]] * len(system)  # the running conversation is never rewritten
        if case.id == "hermes-memory":
            assert "Memory is not available" in json.dumps(requests[1]["messages"][-1])
        if case.id == "hermes-skill_manage":
            assert (log / "home" / ".hermes" / "skills" / "write-hello" / "SKILL.md").is_file()
    else:  # OpenClaw: a fixed tool list; each request ends with the transient context message
        assert tool_names == [tool_names[0]] * len(tool_names)
        for earlier, later in zip(requests, requests[1:], strict=False):
            last = earlier["messages"][-1]
            assert last["role"] == "user" and OPENCLAW_CONTEXT in json.dumps(last)
            assert later["messages"][len(earlier["messages"]) - 1] != last  # dropped, not kept
