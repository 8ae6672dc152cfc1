"""Teacher rollouts recorded the way ``harnessrl sft`` finds them: a real gateway on 127.0.0.1 with
the scripted engine as the teacher (it answers call k of a rollout with turn k of its script), an
OpenAI-style agent loop over HTTP that runs the tool calls it gets, and the run folder's own SQLite
store, with each rollout finished with a reward (and, for some, flags or an audit finding)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.schemas import Outcome
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

ADMIN_KEY = "sft-test-admin"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]

#: A teacher that calls a tool, reads its output, then answers.
SOLVING = [
    {"content": "Let me look.", "tool_calls": [{"name": "bash", "arguments": {"command": "cat a.txt"}}]},
    {"content": "The answer is 42."},
]


@dataclass
class Recorded:
    run_dir: Path
    store: SQLiteStore
    rollout_ids: list[str]


def agent(base_url: str, api_key: str, task: str, max_calls: int = 4) -> None:
    """A minimal tool-calling harness: chat until the model stops calling tools."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful agent."},
        {"role": "user", "content": task},
    ]
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30) as http:
        for _ in range(max_calls):
            reply = http.post("/chat/completions", json={"model": "m", "messages": messages, "tools": TOOLS})
            reply.raise_for_status()
            message = reply.json()["choices"][0]["message"]
            messages.append(message)
            if not message.get("tool_calls"):
                return
            for call in message["tool_calls"]:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": "42\n"})


def anthropic_agent(base_url: str, api_key: str, task: str, max_calls: int = 4) -> None:
    """The same loop over the Anthropic Messages API."""
    tools = [
        {
            "name": "bash",
            "description": "run a shell command",
            "input_schema": TOOLS[0]["function"]["parameters"],
        }
    ]
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    with httpx.Client(base_url=base_url, headers={"x-api-key": api_key}, timeout=30) as http:
        for _ in range(max_calls):
            body = {
                "model": "m",
                "max_tokens": 256,
                "system": "You are a careful agent.",
                "messages": messages,
            }
            reply = http.post("/messages", json={**body, "tools": tools})
            reply.raise_for_status()
            content = reply.json()["content"]
            messages.append({"role": "assistant", "content": content})
            uses = [b for b in content if b["type"] == "tool_use"]
            if not uses:
                return
            results = [{"type": "tool_result", "tool_use_id": b["id"], "content": "42\n"} for b in uses]
            messages.append({"role": "user", "content": results})


def responses_agent(base_url: str, api_key: str, task: str, max_calls: int = 4) -> None:
    """The same loop over the OpenAI Responses API (stateless: the whole input each time)."""
    tools = [{"type": "function", **TOOLS[0]["function"]}]
    items: list[dict[str, Any]] = [{"role": "user", "content": task}]
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30) as http:
        for _ in range(max_calls):
            body = {"model": "m", "instructions": "You are a careful agent.", "input": items, "tools": tools}
            reply = http.post("/responses", json=body)
            reply.raise_for_status()
            output = reply.json()["output"]
            items.extend(output)
            calls = [item for item in output if item["type"] == "function_call"]
            if not calls:
                return
            items.extend(
                {"type": "function_call_output", "call_id": c["call_id"], "output": "42\n"} for c in calls
            )


AGENTS = {"chat": agent, "messages": anthropic_agent, "responses": responses_agent}


@pytest.fixture
def solving() -> list[dict[str, Any]]:
    return [dict(turn) for turn in SOLVING]


@pytest.fixture(scope="session")
def tokenizer() -> PolicyTokenizer:
    return PolicyTokenizer.from_dir(tiny_model_dir(weights=False))


@pytest.fixture
def record(tmp_path: Path, tokenizer: PolicyTokenizer) -> Iterator[Any]:
    """``record(turns_per_rollout, rewards, flags=..., audit=...)`` -> ``Recorded``: one rollout per
    entry, each answered by its own script, finished with its reward."""
    stack = contextlib.ExitStack()

    def make(
        scripts: Sequence[Sequence[Any]],
        rewards: Sequence[float],
        *,
        flags: Sequence[Sequence[str]] | None = None,
        audit: Sequence[bool] | None = None,
        run_dir: Path | None = None,
        api: str = "chat",
    ) -> Recorded:
        run_dir = run_dir or tmp_path / "teacher"
        run_dir.mkdir(parents=True, exist_ok=True)
        store = SQLiteStore(run_dir / "harnessrl.db")
        stack.callback(store.close)
        ids = []
        for i, (script, reward) in enumerate(zip(scripts, rewards, strict=True)):
            engine = ScriptedEngine(list(script), tokenizer)
            app = create_app(GatewayConfig(admin_key=ADMIN_KEY), store, engine)
            with serve_in_thread(app) as url, GatewayClient(url, ADMIN_KEY) as client:
                created = client.create_rollout({"prompt": f"task {i}"}, run_id="teacher", task_id=f"t{i}")
                AGENTS[api](created["base_url"], created["api_key"], f"What is in a.txt? (task {i})")
            rid = created["rollout_id"]
            if flags and flags[i]:
                store.set_rollout_flags(rid, list(flags[i]))
            metadata = {"audit": [{"rule": "git_history", "detail": "git log"}]} if audit and audit[i] else {}
            store.finish_rollout(rid, Outcome.SUCCESS, reward, metadata=metadata)
            ids.append(rid)
        return Recorded(run_dir, store, ids)

    with stack:
        yield make
