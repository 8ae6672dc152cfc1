"""The retriever's MCP face through a real tool-calling harness: the unmodified harness starts
harnessrl's MCP server inside its sandbox (configured by the preset through the harness's own flags or
config, ``harness.tools = ["search"]``), the scripted policy calls the ``search`` tool, the server asks
the gateway's search route through the sandbox's one relayed socket, and the passages come back to
the policy as the tool's result. Checked: the search recorded in the store (query and passages), the
next call's prompt holding the passage, the answer scored by ``score_search`` (exact match).

The control is the same rollout without ``tools``: the harness offers no such tool and nothing is
searched, so the records above come from the MCP server and from nowhere else.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harnessrl.store.sqlite import SQLiteStore

from .test_matrix import harness_or_skip

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")]

HARNESSRL = [sys.executable, "-m", "harnessrl"]
PASSAGES = [
    {"id": "velmora", "title": "Velmora", "text": "Velmora is a city founded in 1432 by Arlen Voss."},
    {"id": "tarsk", "title": "Tarsk", "text": "Tarsk is a city in Dornmark."},
]
QUESTION = "Who founded the city of Velmora?"


@dataclass(frozen=True)
class McpCase:
    preset: str
    tool: str  # the name the harness gives harnessrl's MCP tool
    api: str


CASES = [McpCase("claude-code", "mcp__harnessrl__search", "messages")]


def run(tmp_path: Path, case: McpCase, *, tools: bool) -> tuple[dict[str, Any], list[Any], list[Any]]:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    turns = [
        {
            "content": "Let me search.",
            "tool_calls": [{"name": case.tool, "arguments": {"query": "Velmora founded"}}],
        },
        {"content": "<answer>Arlen Voss</answer>"},
    ]
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": turns, "on_exhausted": "repeat_last"}))
    config = tmp_path / "rollout.toml"
    config.write_text(
        f"""
[engine]
model = "scripted:{script}"
context_length = 262144

[retrieval]
corpus = "{corpus}"
cache_dir = "{tmp_path / "cache"}"

[harness]
preset = "{case.preset}"
tools = {json.dumps(["search"] if tools else [])}
timeout_s = 180

[harness.limits]
memory_mb = 8192
max_processes = 1024

[evaluator]
type = "python"
function = "harnessrl.tasks.search:score_search"
kwargs = {{ source = "final_answer" }}

[controller]
max_infra_retries = 0
"""
    )
    task = {"prompt": QUESTION, "hidden": {"answers": ["Arlen Voss"]}}
    proc = subprocess.run(
        [
            *HARNESSRL,
            "rollout",
            "--config",
            str(config),
            "--task",
            json.dumps(task),
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    store = SQLiteStore(tmp_path / "run" / "harnessrl.db")
    try:
        calls = store.list_calls(summary["rollout_id"])
        searches = store.list_tool_requests(summary["rollout_id"])
    finally:
        store.close()
    return summary, calls, searches


def offered_tools(call: Any) -> set[str]:
    names = set()
    for tool in call.request.get("tools") or []:
        names.add(tool.get("name") or (tool.get("function") or {}).get("name"))
    return names


@pytest.mark.parametrize("case", CASES, ids=[c.preset for c in CASES])
def test_a_tool_calling_harness_searches_through_the_mcp_server(case: McpCase, tmp_path: Path) -> None:
    harness_or_skip(case.preset)
    summary, calls, searches = run(tmp_path, case, tools=True)
    log = Path(summary["log"])
    context = f"{summary}\nstderr: {(log / 'stderr.log').read_text()[-2000:]}"
    assert case.tool in offered_tools(calls[0]), context
    [search] = searches
    assert search.tool == "search" and search.request["query"] == "Velmora founded", context
    assert search.response["passages"][0]["id"] == "velmora"
    # The passages reached the policy: the next call's prompt (as the harness sent it) holds them.
    assert len(calls) == 2 and all(c.api == case.api for c in calls), context
    assert "founded in 1432 by Arlen Voss" in json.dumps(calls[1].request), context
    assert summary["reward"] == 1.0 and summary["outcome"] == "success", context


@pytest.mark.parametrize("case", CASES, ids=[c.preset for c in CASES])
def test_control_without_the_tool_nothing_is_searched(case: McpCase, tmp_path: Path) -> None:
    harness_or_skip(case.preset)
    summary, calls, searches = run(tmp_path, case, tools=False)
    assert case.tool not in offered_tools(calls[0])
    assert searches == []
    assert "founded in 1432" not in json.dumps([c.request for c in calls])
