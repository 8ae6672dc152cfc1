"""The Messages API's per-call shortcuts give exactly what the long way gives (issue 22).

- a non-streaming Messages call lets the engine answer whole (no per-token stream) unless stop
  sequences must be watched, as a chat call does;
- a Claude Code-shaped conversation (system blocks, tools, tool_use / tool_result blocks, a
  ``cache_control`` marker that moves onto the newest block every turn) keys its messages
  incrementally: the marker never reaches the internal messages, so a message that differs from the
  previous request's only by it keeps its normalized form (a token count in between does not replace
  the remembered request); the stored request stays what the client sent, and every prompt is the
  full path's, token for token;
- Messages and chat calls of one rollout share its reuse memory and still build exact prompts.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from harnessrl.config import GatewayConfig
from harnessrl.engines.base import GenerationContext, Samples, SamplingParams
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.gateway import create_app
from harnessrl.gateway.apis.anthropic_convert import request_to_internal
from harnessrl.gateway.prompt.conversation import build_prompt
from harnessrl.gateway.prompt.history import prior_from_call
from harnessrl.gateway.prompt.messages import KeyedMessages, normalize_messages
from harnessrl.gateway.server import serve_in_thread
from harnessrl.gateway.state import GatewayState
from harnessrl.schemas import Call
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

from .conftest import ADMIN_KEY

MARKER = {"type": "ephemeral"}
TOOLS = [
    {
        "name": "bash",
        "description": "Run a bash command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]
SYSTEM = [
    {"type": "text", "text": "You are a coding agent."},
    {"type": "text", "text": "Keep changes minimal.", "cache_control": MARKER},
]
ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01"}


class RecordingEngine(ScriptedEngine):
    """The scripted engine, remembering the context of every generation it was asked for."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.contexts: list[GenerationContext | None] = []

    def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, context: GenerationContext | None = None
    ) -> AsyncIterator[Samples]:
        self.contexts.append(context)
        return super().generate(prompt_ids, params, context)


class Served:
    def __init__(self, url: str, http: httpx.Client, store: SQLiteStore, state: GatewayState):
        self.url, self.http, self.store, self.state = url, http, store, state

    def rollout(self) -> dict[str, Any]:
        r = self.http.post(
            f"{self.url}/api/rollouts", json={}, headers={"authorization": f"Bearer {ADMIN_KEY}"}
        )
        assert r.status_code == 201, r.text
        return r.json()

    def messages(self, rollout: dict[str, Any], body: dict[str, Any]) -> httpx.Response:
        headers = {**ANTHROPIC_HEADERS, "x-api-key": rollout["api_key"]}
        r = self.http.post(f"{rollout['base_url']}/messages", json=body, headers=headers)
        assert r.status_code == 200, r.text
        return r

    def count_tokens(self, rollout: dict[str, Any], body: dict[str, Any]) -> int:
        headers = {**ANTHROPIC_HEADERS, "x-api-key": rollout["api_key"]}
        r = self.http.post(f"{rollout['base_url']}/messages/count_tokens", json=body, headers=headers)
        assert r.status_code == 200, r.text
        return int(r.json()["input_tokens"])

    def chat(self, rollout: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        headers = {"authorization": f"Bearer {rollout['api_key']}"}
        r = self.http.post(f"{rollout['base_url']}/chat/completions", json=body, headers=headers)
        assert r.status_code == 200, r.text
        return r.json()

    def last_keyed(self, rollout: dict[str, Any]) -> KeyedMessages | None:
        # The memory is loaded after the first call, so ``get`` answers at once.
        memory = asyncio.run(self.state.history.get(rollout["rollout_id"], rollout["attempt"]))
        return memory.last_keyed


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    """``serve(engine)``: a gateway on 127.0.0.1 in front of ``engine``; stopped at teardown."""
    with contextlib.ExitStack() as stack:

        def start(engine: ScriptedEngine) -> Served:
            store = SQLiteStore(tmp_path / "store.db")
            stack.callback(store.close)
            app = create_app(GatewayConfig(admin_key=ADMIN_KEY), store, engine)
            url = stack.enter_context(serve_in_thread(app))
            http = stack.enter_context(httpx.Client(timeout=30))
            return Served(url, http, store, app.state.gateway)

        yield start


def fresh_tokenizer() -> PolicyTokenizer:
    """Its own incremental-splice trust counter: the first calls are checked the full way, later
    ones take the event-loop path (``conversation.quick_prompt``)."""
    return PolicyTokenizer.from_dir(tiny_model_dir(weights=False))


def test_whole_answers_are_not_streamed_by_the_engine(serve: Any) -> None:
    engine = RecordingEngine(["A scripted answer."] * 4, fresh_tokenizer())
    gw = serve(engine)
    rollout = gw.rollout()
    user = [{"role": "user", "content": "hi"}]
    for extra in (
        {},
        {"stream": True},
        {"stop_sequences": ["zzz"]},
        {"stream": True, "stop_sequences": ["zzz"]},
    ):
        r = gw.messages(rollout, {"model": "m", "max_tokens": 64, "messages": user, **extra})
        if not extra.get("stream"):
            assert r.json()["content"] == [{"type": "text", "text": "A scripted answer."}]
    # Only a client that reads the answer as it comes, or stop sequences to watch, need a stream.
    assert [c.stream for c in engine.contexts if c is not None] == [False, True, True, True]


def _tool_turn(k: int) -> dict[str, Any]:
    return {"content": f"Step {k}.", "tool_calls": [{"name": "bash", "arguments": {"command": f"ls {k}"}}]}


def _claude_code_body(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Claude Code's habit: only the newest message's last block carries the cache marker."""
    sent = copy.deepcopy(history)
    sent[-1]["content"][-1]["cache_control"] = MARKER
    return {"model": "m", "max_tokens": 256, "system": SYSTEM, "tools": TOOLS, "messages": sent}


def _assert_long_path(tokenizer: PolicyTokenizer, calls: list[Call]) -> None:
    """Each call's prompt is the full (non-incremental) path's, and extends the previous call."""
    for k, call in enumerate(calls):
        if call.api == "messages":
            messages, tools = request_to_internal(call.request)
        else:
            messages, tools = call.request["messages"], call.request.get("tools")
        priors = [p for p in (prior_from_call(c) for c in calls[:k]) if p is not None]
        plan = build_prompt(tokenizer, normalize_messages(messages), priors, tools=tools, incremental=False)
        assert plan.prompt_ids == call.prompt_token_ids, f"call {call.seq}"
        if k:
            head = calls[k - 1].prompt_token_ids + calls[k - 1].response_token_ids
            assert call.prompt_token_ids[: len(head)] == head, f"call {call.seq} does not extend"
            assert call.usage.prompt_source == "reused"


def test_moving_cache_marker_keeps_the_keyed_history_and_exact_prompts(serve: Any) -> None:
    turns = 6
    tokenizer = fresh_tokenizer()
    gw = serve(ScriptedEngine([*(_tool_turn(k) for k in range(turns)), "Done."], tokenizer))
    rollout = gw.rollout()
    history: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"},
                                     {"type": "text", "text": "Fix the bug."}]},
    ]  # fmt: skip
    sent: list[dict[str, Any]] = []
    previous: KeyedMessages | None = None
    for k in range(turns + 1):
        body = _claude_code_body(history)
        sent.append(body)
        answer = gw.messages(rollout, body).json()
        keyed = gw.last_keyed(rollout)
        assert keyed is not None
        if previous is not None:
            # The previous request's messages (its newest one had the marker, this request's copy
            # has not) were not normalized again: the same objects.
            assert len(keyed.messages) > len(previous.messages)
            assert all(a is b for a, b in zip(keyed.messages, previous.messages, strict=False))
        previous = keyed
        # Claude Code counts other texts' tokens between calls: a count is not the rollout's last request.
        assert (
            gw.count_tokens(rollout, {"model": "m", "messages": [{"role": "user", "content": "count"}]}) > 0
        )
        assert gw.last_keyed(rollout) is keyed
        if k == turns:
            assert answer["content"] == [{"type": "text", "text": "Done."}]
            break
        history.append({"role": "assistant", "content": answer["content"]})
        [use] = [b for b in answer["content"] if b["type"] == "tool_use"]
        history.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": f"out {k}"}],
            }
        )
    calls = gw.store.list_calls(rollout["rollout_id"])
    assert len(calls) == turns + 1
    # Stored exactly as sent, markers included: only the internal messages leave them out.
    assert [c.request for c in calls] == sent
    _assert_long_path(tokenizer, calls)


def _anthropic_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat answer as the Anthropic blocks a harness would send back for it."""
    blocks: list[dict[str, Any]] = (
        [{"type": "text", "text": message["content"]}] if message["content"] else []
    )
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        blocks.append(
            {"type": "tool_use", "id": call["id"], "name": fn["name"], "input": json.loads(fn["arguments"])}
        )
    return blocks


def test_messages_and_chat_calls_of_one_rollout_build_exact_prompts(serve: Any) -> None:
    turns = 5
    tokenizer = fresh_tokenizer()
    gw = serve(ScriptedEngine([_tool_turn(k) for k in range(turns)], tokenizer))
    rollout = gw.rollout()
    history: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Fix the bug."}]}]
    for k in range(turns):
        body = _claude_code_body(history)
        if k % 2:
            # The same conversation through the chat API: the internal messages, sent as they are.
            messages, tools = request_to_internal(body)
            choice = gw.chat(rollout, {"messages": messages, "tools": tools, "max_tokens": 256})["choices"][0]
            blocks = _anthropic_blocks(choice["message"])
        else:
            blocks = gw.messages(rollout, body).json()["content"]
        history.append({"role": "assistant", "content": blocks})
        [use] = [b for b in blocks if b["type"] == "tool_use"]
        history.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": f"out {k}"}],
            }
        )
    calls = gw.store.list_calls(rollout["rollout_id"])
    assert [c.api for c in calls] == ["messages", "chat.completions"] * (turns // 2) + ["messages"]
    _assert_long_path(tokenizer, calls)
