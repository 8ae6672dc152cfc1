"""The final answer is the main conversation's, not a side call's: calls recorded by a real gateway
(scripted engine, the tiny model's tokenizer, a fresh SQLite store) from the Anthropic SDK, the way
Claude Code talks: a main agent with its system prompt and tools, and, after its answer, a small
call with a system prompt of its own (a title) that the harness or the policy's code made."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anthropic
import pytest

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.controller.evaluators import build_evaluator
from harnessrl.controller.evaluators.types import EvaluationInput
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.schemas import Call
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tasks.answers import final_answer_text, side_calls
from harnessrl.tasks.search import score_search
from harnessrl.tokenizer import PolicyTokenizer

ADMIN_KEY = "test-admin-key"
GOLD = "Arlen Voss"
MAIN_SYSTEM = (
    "You are a research agent. Search the encyclopedia with the search tool, one hop at a time, "
    "and give your final answer inside <answer></answer> tags. " * 4
)
TOOLS = [
    {
        "name": "search",
        "description": "Search the encyclopedia for passages.",
        "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
    }
]
QUESTION = "Who founded the city of Velmora?"
TITLE_SYSTEM = "Write a 3-word title for this conversation."


@pytest.fixture(scope="module")
def tokenizer() -> PolicyTokenizer:
    return PolicyTokenizer.from_dir(tiny_model_dir(weights=False))


@pytest.fixture
def record_calls(tokenizer: PolicyTokenizer, tmp_path: Path) -> Iterator[Callable[..., list[Call]]]:
    """``record_calls(replies, talk)``: a gateway whose engine answers ``replies`` in turn; ``talk``
    is run with an Anthropic client of a new rollout; returns the calls the store recorded."""
    stack = contextlib.ExitStack()

    def record(replies: list[str], talk: Callable[[anthropic.Anthropic], None]) -> list[Call]:
        store = SQLiteStore(tmp_path / "store.db")
        stack.callback(store.close)
        app = create_app(GatewayConfig(admin_key=ADMIN_KEY), store, ScriptedEngine(replies, tokenizer))
        url = stack.enter_context(serve_in_thread(app))
        client = GatewayClient(url, ADMIN_KEY)
        stack.callback(client.close)
        rollout = client.create_rollout({"prompt": QUESTION})
        sdk = anthropic.Anthropic(
            base_url=f"{url}/rollouts/{rollout['rollout_id']}", api_key=rollout["api_key"], max_retries=0
        )
        with sdk:
            talk(sdk)
        return store.list_calls(rollout["rollout_id"])

    with stack:
        yield record


def _main_agent(sdk: anthropic.Anthropic) -> None:
    """Two turns of the main agent: a first look, then the answer after the tool's output."""
    history: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    first = sdk.messages.create(
        model="scripted", max_tokens=64, system=MAIN_SYSTEM, tools=TOOLS, messages=history
    )
    history += [
        {"role": "assistant", "content": first.content[0].text},
        {"role": "user", "content": "Velmora is a city founded in 1432 by Arlen Voss."},
    ]
    sdk.messages.create(model="scripted", max_tokens=64, system=MAIN_SYSTEM, tools=TOOLS, messages=history)


def _title_call(sdk: anthropic.Anthropic) -> None:
    """A side call as Claude Code makes one: its own short system prompt, no tools, the question."""
    sdk.messages.create(
        model="scripted",
        max_tokens=16,
        system=TITLE_SYSTEM,
        messages=[{"role": "user", "content": QUESTION}],
    )


MAIN_REPLIES = ["Let me search for Velmora.", f"<answer>{GOLD}</answer>"]


def _scores(calls: list[Call], workspace: Path) -> tuple[float, float]:
    """``score_search(source="final_answer")`` and ``exact_match`` (pattern: the answer tag) of ``calls``."""
    search = score_search(
        SimpleNamespace(task={"hidden": {"answers": [GOLD]}}, workspace=workspace, calls=calls),
        source="final_answer",
    )["reward"]
    evaluator = build_evaluator({"type": "exact_match", "pattern": "<answer>(.*?)</answer>"})
    inp = EvaluationInput(task={"hidden": {"answer": GOLD}}, workspace=workspace, calls=calls)
    return search, asyncio.run(evaluator.evaluate(inp)).reward


def test_a_title_call_after_the_answer_is_not_the_answer(record_calls, tmp_path: Path) -> None:
    calls = record_calls(
        [*MAIN_REPLIES, "Velmora founder search"], lambda sdk: (_main_agent(sdk), _title_call(sdk))
    )
    assert [c.seq for c in calls] == [0, 1, 2]
    assert side_calls(calls) == {2}
    assert final_answer_text(calls) == f"<answer>{GOLD}</answer>"
    assert _scores(calls, tmp_path) == (1.0, 1.0)


def test_an_answer_planted_in_a_side_call_is_not_read(record_calls, tmp_path: Path) -> None:
    """The main agent answers wrong; a side call (the policy's own code) says the gold answer."""
    calls = record_calls(
        ["Let me search for Velmora.", "<answer>Tarsk</answer>", f"<answer>{GOLD}</answer>"],
        lambda sdk: (_main_agent(sdk), _title_call(sdk)),
    )
    assert final_answer_text(calls) == "<answer>Tarsk</answer>"
    assert _scores(calls, tmp_path) == (0.0, 0.0)


def test_control_without_a_side_call_the_main_agent_answers(record_calls, tmp_path: Path) -> None:
    calls = record_calls(MAIN_REPLIES, _main_agent)
    assert side_calls(calls) == set()
    assert _scores(calls, tmp_path) == (1.0, 1.0)


def test_control_a_lone_call_as_long_as_the_main_prompt_is_kept(record_calls, tmp_path: Path) -> None:
    """The main agent after its history was compacted: a new chain, but no shorter than its first
    prompt (the same system prompt, tools and question, plus a summary): its answer counts."""

    def compacted(sdk: anthropic.Anthropic) -> None:
        _main_agent(sdk)
        summary = "Summary so far: the encyclopedia says Velmora was founded by Arlen Voss."
        sdk.messages.create(
            model="scripted",
            max_tokens=64,
            system=MAIN_SYSTEM,
            tools=TOOLS,
            messages=[{"role": "user", "content": f"{QUESTION}\n\n{summary}"}],
        )

    calls = record_calls(
        ["Let me search for Velmora.", "<answer>Tarsk</answer>", f"<answer>{GOLD}</answer>"], compacted
    )
    assert side_calls(calls) == set()
    assert _scores(calls, tmp_path) == (1.0, 1.0)


def test_control_one_call_rollouts_read_the_longest_prompt(record_calls, tmp_path: Path) -> None:
    """No chain of two calls: a title call before or after a one-call agent is still a side call."""

    def one_call_agent(sdk: anthropic.Anthropic) -> None:
        _title_call(sdk)
        sdk.messages.create(
            model="scripted",
            max_tokens=64,
            system=MAIN_SYSTEM,
            tools=TOOLS,
            messages=[{"role": "user", "content": QUESTION}],
        )
        _title_call(sdk)

    calls = record_calls(["Velmora title", f"<answer>{GOLD}</answer>", "Velmora title"], one_call_agent)
    assert side_calls(calls) == {0, 2}
    assert _scores(calls, tmp_path) == (1.0, 1.0)


def test_a_flood_of_side_calls_between_main_turns_leaves_the_answer_found(record_calls) -> None:
    """A policy's code interleaving a hundred side calls with the agent's turns: the main chain is no
    longer matched against (only the most recent chains are, so the cost stays linear), its next
    call stands alone, but is as long as the main prompt: still the answer, the side calls not
    (here they plant the gold answer; the agent's own is wrong)."""

    def talk(sdk: anthropic.Anthropic) -> None:
        history: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
        first = sdk.messages.create(
            model="scripted", max_tokens=64, system=MAIN_SYSTEM, tools=TOOLS, messages=history
        )
        _title_call(sdk)
        history += [
            {"role": "assistant", "content": first.content[0].text},
            {"role": "user", "content": "Velmora is a city founded in 1432 by Arlen Voss."},
        ]
        sdk.messages.create(
            model="scripted", max_tokens=64, system=MAIN_SYSTEM, tools=TOOLS, messages=history
        )

    first, title, answer = record_calls(
        ["Let me search.", f"<answer>{GOLD}</answer>", "<answer>Tarsk</answer>"], talk
    )
    floods = [title.model_copy(update={"seq": seq}) for seq in range(1, 101)]
    calls = [first, *floods, answer.model_copy(update={"seq": 101})]
    assert set(range(1, 101)) <= side_calls(calls)  # each says the gold answer: none is read
    assert final_answer_text(calls) == "<answer>Tarsk</answer>"
