"""The pure helpers of ``benchmarks/gateway_overhead.py`` (its bodies, its fake stream, its byte counts
and goals); the benchmark itself is run by hand, never as a timed test."""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from tests.benchmarks.scripts import load_benchmark

from harnessrl.gateway.apis.anthropic_convert import request_to_internal
from harnessrl.schemas import Call
from harnessrl.store import open_store


@pytest.fixture(scope="module")
def go() -> ModuleType:
    return load_benchmark("gateway_overhead")


@pytest.fixture(scope="module")
def reply(go: ModuleType) -> dict[str, Any]:
    return go.build_reply(go._tokenizer())


@pytest.fixture(scope="module")
def upstream(go: ModuleType, reply: dict[str, Any]) -> Any:
    """The benchmark's upstream (the shared fake vLLM) in process."""
    from starlette.testclient import TestClient

    with TestClient(go.upstream_app(reply, go._tokenizer())) as client:
        yield client


def sse_events(body: str) -> list[Any]:
    data = [line[len("data: ") :] for line in body.split("\n\n") if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_the_upstream_streams_chat_one_token_per_event_as_vllm_does(
    go: ModuleType, reply: dict[str, Any], upstream: Any
) -> None:
    body = {"model": go.MODEL, "messages": [{"role": "user", "content": "x" * 400}], "stream": True}
    body |= {"logprobs": True, "return_token_ids": True, "stream_options": {"include_usage": True}}
    raw = json.dumps(body).encode()
    events = sse_events(upstream.post("/v1/chat/completions", content=raw).text)
    first, tokens, usage = events[0], events[1:-1], events[-1]
    # What vLLM serving the tiny model reports: the conversation rendered with its template, tokenized.
    expected = go._tokenizer().encode_chat(body["messages"])
    assert first["prompt_token_ids"] == expected and len(expected) > len(raw) // 4
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len(tokens) == len(reply["token_ids"]) == go.OUTPUT_TOKENS
    choices = [e["choices"][0] for e in tokens]
    assert [c["token_ids"] for c in choices] == [[t] for t in reply["token_ids"]]
    assert [c["logprobs"]["content"][0]["token"] for c in choices] == reply["tokens"]
    assert "".join(c["delta"].get("content", "") for c in choices) == reply["content"]
    calls = [tc for c in choices for tc in c["delta"].get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "bash" and calls[0]["id"]
    assert sum("id" in tc for tc in calls) == 1  # one header, then argument pieces
    assert "".join(tc["function"]["arguments"] for tc in calls) == reply["arguments"]
    assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + ["tool_calls"]
    assert usage["usage"]["completion_tokens"] == go.OUTPUT_TOKENS and usage["choices"] == []
    assert usage["usage"]["prompt_tokens"] == len(expected)


def test_the_upstream_leaves_out_what_was_not_asked_for(go: ModuleType, upstream: Any) -> None:
    body = {"model": go.MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    events = sse_events(upstream.post("/v1/chat/completions", json=body).text)
    assert "prompt_token_ids" not in events[0]
    assert all(e["choices"][0]["logprobs"] is None for e in events)
    assert not any("token_ids" in e["choices"][0] for e in events)
    assert all(e["choices"] for e in events)  # no usage chunk


@pytest.mark.parametrize("as_ids", [True, False])
@pytest.mark.parametrize("stream", [True, False])
def test_the_upstream_completions_answer_the_reply_as_asked(
    go: ModuleType, reply: dict[str, Any], upstream: Any, as_ids: bool, stream: bool
) -> None:
    """What the gateway's engine reads: the reply's token IDs, texts and logprobs, ending at the stop
    token it names."""
    stop = reply["token_ids"][-1]
    body = {"model": go.MODEL, "prompt": [1, 2, 3], "max_tokens": 1000, "logprobs": 0, "stream": stream}
    body |= {"return_token_ids": True, "return_tokens_as_token_ids": as_ids, "stop_token_ids": [stop]}
    answer = upstream.post("/v1/completions", json=body)
    choices = [e["choices"][0] for e in sse_events(answer.text)] if stream else answer.json()["choices"]
    assert len(choices) == (
        go.OUTPUT_TOKENS + 1 if stream else 1
    )  # streamed: one event a token, then the finish
    assert [t for c in choices for t in c["token_ids"]] == reply["token_ids"]
    assert "".join(c["text"] for c in choices) == reply["text"]
    named = [t for c in choices for t in c["logprobs"]["tokens"]]
    assert named == ([f"token_id:{t}" for t in reply["token_ids"]] if as_ids else reply["tokens"])
    assert choices[-1]["finish_reason"] == "stop"
    # vLLM 0.32's logprobs block: offsets over the whole answer, and each sampled token as its top-0.
    logprobs = [lp for c in choices for lp in c["logprobs"]["token_logprobs"]]
    offsets = [o for c in choices for o in c["logprobs"]["text_offset"]]
    assert offsets == [sum(map(len, named[:i])) for i in range(len(named))]
    tops = [top for c in choices for top in c["logprobs"]["top_logprobs"]]
    assert tops == [{name: lp} for name, lp in zip(named, logprobs, strict=True)]


def test_the_upstream_answers_each_api_whole_with_the_reply_as_one_turn(
    go: ModuleType, reply: dict[str, Any], upstream: Any
) -> None:
    """The direct and Agent Lightning targets' answers: the same assistant turn in each API's shape."""
    one = [{"role": "user", "content": "hi"}]
    chat = upstream.post("/v1/chat/completions", json={"model": go.MODEL, "messages": one}).json()
    message = chat["choices"][0]["message"]
    assert message["content"] == reply["content"] and chat["choices"][0]["token_ids"] is None
    asked = {"model": go.MODEL, "messages": one, "logprobs": True, "return_token_ids": True}
    choice = upstream.post("/v1/chat/completions", json=asked).json()["choices"][0]
    assert [e["token"] for e in choice["logprobs"]["content"]] == reply["tokens"]
    assert choice["token_ids"] == reply["token_ids"]
    assert message["tool_calls"][0]["function"] == {"name": "bash", "arguments": reply["arguments"]}
    anthropic = upstream.post("/v1/messages", json={"model": go.MODEL, "messages": []}).content
    assert go.answer_is_message(anthropic)
    blocks = json.loads(anthropic)["content"]
    assert blocks[0]["text"] == reply["content"] and blocks[1]["input"] == json.loads(reply["arguments"])
    responses = upstream.post("/v1/responses", json={"model": go.MODEL, "input": "x"}).content
    assert go.answer_is_response(responses)
    assert json.loads(responses)["output"][1]["arguments"] == reply["arguments"]
    refused = upstream.post("/v1/messages", json={"model": go.MODEL, "messages": [], "stream": True})
    assert refused.status_code == 400 and not go.answer_is_message(refused.content)


def test_sse_complete(go: ModuleType) -> None:
    assert go.sse_complete(b'data: {"x": 1}\n\ndata: [DONE]\n\n')
    assert not go.sse_complete(b'data: {"x": 1}\n\n')
    assert not go.sse_complete(b'data: {"error": {"message": "boom"}}\n\n')


def _without_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if k != "tool_call_id"}
        if "tool_calls" in m:
            m["tool_calls"] = [{**tc, "id": ""} for tc in m["tool_calls"]]
        out.append(m)
    return out


def test_messages_bodies_are_the_chat_conversations(go: ModuleType, reply: dict[str, Any]) -> None:
    """Through the gateway's own converter a Messages body is the chat body's conversation: same
    task, assistant turns, tool results and tools (the system prompt gains the identity block)."""
    chat = go.build_conversations(reply, 2)
    messages = go.build_messages_conversations(reply, 2)
    for c in range(2):
        assert len(messages[c]) == len(chat[c]) == go.TURNS
        for turn in (0, 1, go.TURNS - 1):
            chat_body = json.loads(chat[c][turn])
            internal, tools = request_to_internal(json.loads(messages[c][turn]))
            assert internal[0] == {"role": "system", "content": go._IDENTITY + "\n\n" + go._SYSTEM}
            assert _without_ids(internal[1:]) == _without_ids(chat_body["messages"][1:])
            assert tools == chat_body["tools"]


def test_messages_bodies_are_claude_code_shaped(go: ModuleType, reply: dict[str, Any]) -> None:
    bodies = [json.loads(b) for b in go.build_messages_conversations(reply, 1)[0]]
    sizes = [len(json.dumps(b)) for b in bodies]
    assert sizes == sorted(sizes)  # each turn grows
    for turn, body in enumerate(bodies):
        assert body["max_tokens"] > 0 and body["stream"] is False
        assert [b["type"] for b in body["system"]] == ["text", "text"]
        assert all("input_schema" in t and "parameters" not in t for t in body["tools"])
        msgs = body["messages"]
        assert len(msgs) == 1 + 2 * turn
        assert [m["role"] for m in msgs] == ["user"] + ["assistant", "user"] * turn
        for assistant, result in zip(msgs[1::2], msgs[2::2], strict=True):
            text, use = assistant["content"]
            assert text == {"type": "text", "text": reply["content"]}
            assert use["type"] == "tool_use" and use["input"] == json.loads(reply["arguments"])
            assert result["content"][0]["type"] == "tool_result"
            assert result["content"][0]["tool_use_id"] == use["id"]
        # The cache marker sits on the newest message's last block only.
        marked = [
            (i, j) for i, m in enumerate(msgs) for j, b in enumerate(m["content"]) if "cache_control" in b
        ]
        assert marked == [(len(msgs) - 1, len(msgs[-1]["content"]) - 1)]


def test_responses_bodies_are_the_chat_conversations(go: ModuleType, reply: dict[str, Any]) -> None:
    """Through the gateway's own converter a Responses body is the chat body's conversation: same
    system prompt, task, assistant turns, tool results and tools."""
    from harnessrl.gateway.apis.responses_input import request_to_internal as responses_to_internal

    chat = go.build_conversations(reply, 2)
    responses = go.build_responses_conversations(reply, 2)
    for c in range(2):
        assert len(responses[c]) == len(chat[c]) == go.TURNS
        for turn in (0, 1, go.TURNS - 1):
            chat_body = json.loads(chat[c][turn])
            body = json.loads(responses[c][turn])
            assert body["stream"] is False and body["max_output_tokens"] > 0
            internal, tools = responses_to_internal(body)
            assert _without_ids(internal) == _without_ids(chat_body["messages"])
            assert tools is not None  # Codex's ``strict: false`` is kept on each function
            assert [t["function"].pop("strict") for t in tools] == [False] * len(tools)
            assert tools == chat_body["tools"]


def test_parse_legs(go: ModuleType) -> None:
    assert go.parse_legs("messages,chat") == ["chat", "messages"]
    assert go.parse_legs("responses,stream") == ["stream", "responses"]
    assert go.parse_legs(" stream ") == ["stream"]
    for bad in ("", "chat,bogus", ","):
        with pytest.raises(argparse.ArgumentTypeError):
            go.parse_legs(bad)


def test_answer_is_message(go: ModuleType) -> None:
    assert go.answer_is_message(b'{"type": "message", "content": []}')
    assert not go.answer_is_message(b'{"type": "error", "error": {}}')
    assert not go.answer_is_message(b"data: [DONE]")
    assert not go.answer_is_message(b"[]")


def _level(gateway_ms: dict[str, float], added_p50: dict[str, float]) -> dict[str, Any]:
    level: dict[str, Any] = {"direct": {"cpu_ms_per_call": {"upstream": 1.0}}}
    for name, ms in gateway_ms.items():
        level[name] = {"cpu_ms_per_call": {"upstream": 1.0, "gateway": ms}}
    level["ratios_to_direct"] = {name: {"added_p50_ms": v} for name, v in added_p50.items()}
    return level


def test_agl_goals_ratios_and_met(go: ModuleType) -> None:
    levels = {
        "1": _level({"harnessrl": 1.0, "agentlightning": 4.0}, {"harnessrl": 1.0, "agentlightning": 4.0}),
        "32": _level({"harnessrl": 2.0, "agentlightning": 4.0}, {"harnessrl": 9.0, "agentlightning": 1.0}),
    }
    goals = go.agl_goals(levels)
    cpu, p50 = goals["gateway_cpu_vs_agl"], goals["added_p50_vs_agl"]
    assert "<= 0.3" in cpu["goal"] and "C=1 and C=32" in cpu["goal"]
    assert cpu["c1"] == {"harnessrl_ms": 1.0, "agentlightning_ms": 4.0, "ratio": 0.25, "met": True}
    assert cpu["c32"]["ratio"] == 0.5 and cpu["c32"]["met"] is False
    assert cpu["measured"] == [0.25, 0.5] and cpu["met"] is False
    assert "<= 0.5" in p50["goal"] and p50["measured"] == 0.25 and p50["met"] is True  # C=1 only


def test_agl_goals_without_agent_lightning(go: ModuleType) -> None:
    levels = {c: _level({"harnessrl": 1.0}, {"harnessrl": 1.0}) for c in ("1", "32")}
    goals = go.agl_goals(levels)
    for line in goals.values():
        assert line["measured"] is None and line["met"] is None and line["reason"]
    noisy = {
        c: _level({"harnessrl": 1.0, "agentlightning": 2.0}, {"harnessrl": 1.0, "agentlightning": -0.1})
        for c in ("1", "32")
    }
    p50 = go.agl_goals(noisy)["added_p50_vs_agl"]
    assert p50["measured"] is None and p50["met"] is None and "-0.1" in p50["reason"]


def test_column_bytes_counts_text_and_blobs(go: ModuleType) -> None:
    assert go.column_bytes([("ab", b"\x00\x01\x02", 7, None), ("é", 1.5)]) == 2 + 3 + 2


def test_yardstick_bytes(go: ModuleType) -> None:
    request = {"messages": [{"role": "user", "content": "hi"}]}
    assert go.yardstick_bytes(10, 2, request) == 48 + len(json.dumps(request, separators=(",", ":")))


def test_summarize_store_keeps_whole_rollouts(go: ModuleType) -> None:
    def entry(conv: int, calls: int, stored: int) -> dict[str, Any]:
        return {
            "conversation": conv,
            "calls": calls,
            "row_bytes": stored,
            "yardstick_bytes": 100,
            "ratio": stored / 100,
        }

    entries = [entry(0, go.TURNS, 150), entry(1, go.TURNS, 170), entry(0, go.TURNS, 160), entry(1, 3, 20)]
    s = go.summarize_store(entries, "row_bytes")
    assert s["rollouts"] == 4 and s["rollouts_with_all_calls"] == 3
    assert s["row_bytes"] == {"min": 150, "median": 160, "max": 170}
    assert [p["conversation"] for p in s["per_conversation"]] == [0, 1]
    assert s["per_conversation"][0]["row_bytes"] == 160  # the newest of conversation 0
    assert s["per_conversation"][0]["row_bytes_range"] == [150, 160]
    assert s["per_conversation"][0]["rollouts_of_this_conversation"] == 2


def test_harnessrl_store_bytes_reads_a_real_store(go: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = open_store(str(path))
    rollout_id = store.create_rollout(task={"bench": True}).rollout_id
    prompt: list[int] = list(range(50))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    for turn in range(go.TURNS):
        response = [1000 + turn, 1001 + turn]
        store.add_call(
            Call(
                rollout_id=rollout_id,
                request={"model": "m", "messages": messages},
                response={"role": "assistant", "content": f"turn {turn}"},
                prompt_token_ids=prompt,
                response_token_ids=response,
                response_logprobs=[-0.5, -0.25],
            )
        )
        prompt = [*prompt, *response, 7, 8, 9]
        messages = [
            *messages,
            {"role": "assistant", "content": f"turn {turn}"},
            {"role": "user", "content": "go"},
        ]
    final = store.list_calls(rollout_id)[-1]
    store.close()
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT * FROM calls WHERE rollout_id = ?", (rollout_id,)).fetchall()
    conn.close()

    s = go.harnessrl_store_bytes(path, [(rollout_id, 9)], 8)

    [entry] = s["per_conversation"]
    assert entry["conversation"] == 1 and entry["calls"] == go.TURNS
    assert entry["row_bytes"] == go.column_bytes(rows)
    assert entry["final_prompt_tokens"] == len(final.prompt_token_ids)
    assert entry["yardstick_bytes"] == go.yardstick_bytes(
        len(final.prompt_token_ids), len(final.response_token_ids), final.request
    )
    assert entry["ratio"] == round(entry["row_bytes"] / entry["yardstick_bytes"], 3)


def test_cpu_between_samples_counts_threads_in_nanoseconds(go: ModuleType) -> None:
    """Threads' nanoseconds where every thread of the first sample is still there (one started since
    counts from zero); clock ticks where one exited (its nanoseconds went with it)."""
    before = (1.0, {(1, 1): 5_000_000, (1, 2): 1_000_000})
    grown = (1.02, {(1, 1): 6_000_000, (1, 2): 1_500_000, (1, 3): 250_000})
    assert go.cpu_seconds_between(before, grown) == pytest.approx(0.00175)
    shrunk = (1.02, {(1, 1): 6_000_000})
    assert go.cpu_seconds_between(before, shrunk) == pytest.approx(0.02)
    assert go.cpu_seconds_between((1.0, {}), (1.03, {})) == pytest.approx(0.03)  # no schedstat


def test_cpu_sample_of_this_process_moves_with_its_work(go: ModuleType) -> None:
    import os

    before = go.cpu_sample(os.getpid())
    sum(i * i for i in range(300_000))
    after = go.cpu_sample(os.getpid())
    used = go.cpu_seconds_between(before, after)
    assert 0 < used < 5 and before[1], before


def test_measure_interleaves_the_legs_and_their_targets_round_by_round(
    go: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each round sends one batch per leg (while it has rounds left) and target, both orders rotated:
    a leg's ratio to another is measured side by side. Reuse counters are read around each harnessrl
    batch into its leg. ``run_batch`` records instead of sending."""
    import asyncio

    sent: list[tuple[int, str, str, int]] = []  # (concurrency, leg, target, conversations)

    async def recording(
        session: Any, target: Any, conversations: Any, n_conv: int, workers: int, complete: Any
    ) -> Any:
        sent.append((workers, conversations[0][0].decode(), target.name, n_conv))
        return {
            "latencies": [0.001] * n_conv,
            "wall_s": 0.01,
            "errors": [],
            "load_avg_1m": 0.0,
            "cpu_s": {"upstream": 0.001, "client": 0.001},
        }

    monkeypatch.setattr(go, "run_batch", recording)
    counter = {"reused": 0.0}

    async def reuse() -> dict[str, float]:
        counter["reused"] += 1.0  # moves by 1 between the two reads around a harnessrl batch
        return dict(counter)

    def leg(name: str, rounds_c32: int) -> Any:
        targets = [go.Direct("http://d"), go.Harnessrl("http://h", "k")]
        return go.LegRun(name, targets, [[name.encode()]], [(1, 2, 3), (32, rounds_c32, 64)])

    legs = [leg("chat", 2), leg("stream", 1)]
    levels = asyncio.run(go.measure(legs, reuse))

    measured = [(c, name, target) for c, name, target, n in sent if n in (3, 64)]
    warm_ups = [(c, name, target) for c, name, target, n in sent if n not in (3, 64)]
    assert measured == [
        (1, "chat", "direct"),
        (1, "chat", "harnessrl"),
        (1, "stream", "direct"),
        (1, "stream", "harnessrl"),
        (1, "stream", "harnessrl"),
        (1, "stream", "direct"),
        (1, "chat", "harnessrl"),
        (1, "chat", "direct"),
        (32, "chat", "direct"),
        (32, "chat", "harnessrl"),
        (32, "stream", "direct"),
        (32, "stream", "harnessrl"),
        (32, "chat", "harnessrl"),
        (32, "chat", "direct"),  # stream has one C=32 round: chat alone
    ]
    assert len(warm_ups) == 8  # a warm-up batch per level, leg and target, before that level's rounds
    assert levels["chat"]["32"]["harnessrl"]["requests"] == 2 * 64
    assert levels["stream"]["32"]["direct"]["requests"] == 64
    # 2 + 2 measured and 2 warm-up harnessrl batches per leg, each moving the counter by 1
    assert legs[0].reuse == {"reused": 6.0} and legs[1].reuse == {"reused": 5.0}


def test_idle_cpu_tells_a_busy_process_from_a_sleeping_one(go: ModuleType) -> None:
    import subprocess
    import sys

    def start(code: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", f"print('up', flush=True)\n{code}"], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"  # its start-up is over
        return proc

    busy = start("while True: pass")
    sleeping = start("import time; time.sleep(60)")
    try:
        idle = go.idle_cpu({"busy": busy.pid, "sleeping": sleeping.pid}, 2.0)
    finally:
        busy.kill()
        sleeping.kill()
        busy.wait()
        sleeping.wait()
    assert set(idle) == {"busy", "sleeping"}
    # ms of CPU per second, told apart by ratio: on 2 cores shared with a loaded test run the busy
    # one may get ~100 ms/s (a fixed "most of a core" failed there), the sleeping one gets ~0.
    assert idle["sleeping"] < 5
    assert idle["busy"] > 10 * max(idle["sleeping"], 2)
