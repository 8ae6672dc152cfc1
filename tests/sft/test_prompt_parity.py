"""The student is trained behind the prompts the gateway sends it at RL time, token for token, also
where its template renders an earlier turn otherwise once more turns follow.

Qwen3's template drops the reasoning of assistant turns before the last user message. The gateway
serving the student keeps the sampled turn (its reasoning included) and appends what follows
(``gateway.prompt.splice.splice_after_turn``); sft re-rendered the history instead, so a second
user turn's call was trained behind a prompt without the first answer's reasoning, one the gateway
never sends, and started a new sequence (``history_edited``). Here a real gateway serves the tiny
Qwen3 family (scripted, with reasoning) to a two-turn Anthropic Messages conversation, and sft
renders the recorded calls for the same student: each prompt must be the recorded
``prompt_token_ids``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.gateway import create_app
from harnessrl.gateway.parsers.formats import resolve_formats
from harnessrl.gateway.server import serve_in_thread
from harnessrl.schemas import Call, Outcome, Rollout
from harnessrl.sft.render import rollout_sequences
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

SCRIPT = [
    {"content": "It is 42.", "reasoning": "Six sevens are forty-two."},
    {"content": "It is 56.", "reasoning": "Seven eights are fifty-six."},
]


def student(family: str) -> PolicyTokenizer:
    from harnessrl.engines.tiny_families import family_available, tiny_family_dir

    if (why := family_available(family)) is not None:
        pytest.skip(why)
    return PolicyTokenizer.from_dir(tiny_family_dir(family, weights=False))


def two_user_turns(
    tmp_path: Path, tokenizer: PolicyTokenizer, questions: list[str]
) -> tuple[Rollout, list[Call]]:
    """A harness that asks, keeps the answer (thinking blocks and all, as Claude Code does), asks again."""
    store = SQLiteStore(tmp_path / "gateway.db")
    try:
        app = create_app(GatewayConfig(admin_key="admin"), store, ScriptedEngine(list(SCRIPT), tokenizer))
        with serve_in_thread(app) as url, GatewayClient(url, "admin") as client:
            created = client.create_rollout({"prompt": "x"}, run_id="teacher", task_id="t")
            key = created["api_key"]
            headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
            body: dict[str, Any] = {
                "model": "m",
                "max_tokens": 64,
                "thinking": {"type": "enabled", "budget_tokens": 32},
            }
            messages: list[dict[str, Any]] = []
            for question in questions:
                messages.append({"role": "user", "content": question})
                reply = httpx.post(
                    created["base_url"] + "/messages",
                    json={**body, "messages": messages},
                    headers=headers,
                    timeout=30,
                )
                reply.raise_for_status()
                messages.append({"role": "assistant", "content": reply.json()["content"]})
        store.finish_rollout(created["rollout_id"], Outcome.SUCCESS, 1.0)
        return store.get_rollout(created["rollout_id"]), store.list_calls(created["rollout_id"])
    finally:
        store.close()


def trained_prompts(
    rollout: Rollout, calls: list[Call], tokenizer: PolicyTokenizer
) -> tuple[list[list[int]], Any]:
    formats = resolve_formats("auto", "auto", tokenizer.chat_template)
    samples, report = rollout_sequences(rollout, calls, tokenizer, formats)
    assert (report.rendered, dict(report.skipped)) == (len(calls), {}), report.examples
    prompts = [s.input_ids[: span.start] for s in samples for span in s.spans]
    return prompts, (len(samples), dict(report.breaks))


def test_a_second_user_turn_trains_behind_the_prompt_the_gateway_sends(tmp_path):
    tokenizer = student("qwen3")
    rollout, calls = two_user_turns(tmp_path, tokenizer, ["What is 6 x 7?", "And 7 x 8?"])
    assert [c.usage.prompt_source for c in calls] == ["first", "reused"]
    # the gateway kept the first answer's reasoning in the second prompt
    assert "Six sevens are forty-two." in tokenizer.decode(calls[1].prompt_token_ids)
    prompts, (sequences, breaks) = trained_prompts(rollout, calls, tokenizer)
    assert prompts == [c.prompt_token_ids for c in calls]
    assert (sequences, breaks) == (1, {})  # one sequence, as the RL sample builder makes of them


def test_control_one_user_turn_is_the_gateways_prompt_too(tmp_path):
    tokenizer = student("qwen3")
    rollout, calls = two_user_turns(tmp_path, tokenizer, ["What is 6 x 7?"])
    prompts, _ = trained_prompts(rollout, calls, tokenizer)
    assert prompts == [calls[0].prompt_token_ids]


#: Reasoning and a tool call, a tool call alone, then reasoning and the answer.
TOOL_SCRIPT = [
    {
        "content": "Let me look.",
        "reasoning": "I should read it.",
        "tool_calls": [{"name": "bash", "arguments": {"command": "cat a.txt"}}],
    },
    {
        "content": "And the other one.",
        "tool_calls": [{"name": "bash", "arguments": {"command": "cat b.txt"}}],
    },
    {"content": "The answer is 42.", "reasoning": "It said 42."},
]


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_every_turn_trains_as_the_gateway_served_it_whatever_the_api(tmp_path, api):
    """The gateway's chat API answers a Qwen3 policy's call with its reasoning in the text
    (``<think>…</think>``), and records it so (as does a teacher whose vLLM has no reasoning parser):
    sft read that as text with no reasoning, found reasoning in the student's rendering of it and
    skipped every such turn (``reasoning_dropped``), training only the turns without reasoning.
    Through every API each call now trains on exactly the gateway's prompt and sampled tokens."""
    from tests.sft.conftest import AGENTS

    tokenizer = student("qwen3")
    store = SQLiteStore(tmp_path / "gateway.db")
    try:
        engine = ScriptedEngine(list(TOOL_SCRIPT), tokenizer)
        app = create_app(GatewayConfig(admin_key="admin"), store, engine)
        with serve_in_thread(app) as url, GatewayClient(url, "admin") as client:
            created = client.create_rollout({"prompt": "x"}, run_id="teacher", task_id="t")
            AGENTS[api](created["base_url"], created["api_key"], "What is in a.txt?")
        store.finish_rollout(created["rollout_id"], Outcome.SUCCESS, 1.0)
        rollout, calls = store.get_rollout(created["rollout_id"]), store.list_calls(created["rollout_id"])
    finally:
        store.close()
    assert len(calls) == 3
    formats = resolve_formats("auto", "auto", tokenizer.chat_template)
    samples, report = rollout_sequences(rollout, calls, tokenizer, formats)
    assert (report.rendered, dict(report.skipped)) == (3, {}), report.examples
    spans = [
        (s.input_ids[: span.start], s.input_ids[span.start : span.end]) for s in samples for span in s.spans
    ]
    assert spans == [(c.prompt_token_ids, c.response_token_ids) for c in calls]
