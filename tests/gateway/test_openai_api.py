"""The model API driven by real clients (official openai SDK, sync/async/streaming; litellm) against a
real uvicorn gateway on 127.0.0.1 with the scripted engine."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import httpx
import openai
import pytest

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]
TOOL_TURN = {"content": "Let me check.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls -la"}}]}


def sdk(rollout: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)


def assert_extends(calls: list[Any]) -> None:
    for prev, nxt in zip(calls, calls[1:], strict=False):
        head = prev.prompt_token_ids + prev.response_token_ids
        assert nxt.prompt_token_ids[: len(head)] == head, f"call {nxt.seq} does not extend call {prev.seq}"


def test_sync_chat_is_answered_and_recorded(make_gateway: Any) -> None:
    gw = make_gateway(["Hello from the policy!"])
    rollout = gw.rollout()
    raw = sdk(rollout).chat.completions.with_raw_response.create(
        model="any-name-the-harness-likes",
        messages=[{"role": "user", "content": "hi"}],
        temperature=0.7,
        seed=3,
    )
    resp = raw.parse()
    assert raw.headers["x-harnessrl-call-seq"] == "0"
    assert raw.headers["x-harnessrl-policy-version"] == "0"
    assert resp.model == "any-name-the-harness-likes"
    assert resp.choices[0].message.content == "Hello from the policy!"
    assert resp.choices[0].finish_reason == "stop"
    [call] = gw.client.list_calls(rollout["rollout_id"])
    assert call.response["content"] == "Hello from the policy!"
    assert call.request["messages"] == [{"role": "user", "content": "hi"}]
    assert call.request["temperature"] == 0.7
    assert len(call.response_logprobs) == len(call.response_token_ids) == resp.usage.completion_tokens
    assert call.response_token_ids[-1] == gw.engine.tokenizer.token_to_id("<|im_end|>")
    assert (
        call.usage is not None
        and call.usage.prompt_tokens == len(call.prompt_token_ids) == resp.usage.prompt_tokens
    )
    assert call.started_at <= call.first_token_at <= call.finished_at
    assert gw.client.get_rollout(rollout["rollout_id"])["status"] == "running"  # the first call started it


def test_async_concurrent_rollouts(make_gateway: Any) -> None:
    gw = make_gateway(["one", "two"], token_delay_s=0.002)
    rollouts = [gw.rollout() for _ in range(6)]

    async def drive(rollout: dict[str, Any]) -> list[str]:
        client = openai.AsyncOpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        out = []
        for _ in range(2):
            resp = await client.chat.completions.create(model="m", messages=messages)
            out.append(resp.choices[0].message.content)
            messages += [
                {"role": "assistant", "content": resp.choices[0].message.content},
                {"role": "user", "content": "more"},
            ]
        await client.close()
        return out

    async def main() -> list[list[str]]:
        return await asyncio.gather(*(drive(r) for r in rollouts))

    assert asyncio.run(main()) == [["one", "two"]] * 6
    for r in rollouts:
        calls = gw.client.list_calls(r["rollout_id"])
        assert [c.seq for c in calls] == [0, 1]
        assert_extends(calls)


def test_streaming_content_token_by_token(make_gateway: Any) -> None:
    gw = make_gateway(["Streaming works one token at a time."])
    rollout = gw.rollout()
    stream = sdk(rollout).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
        logprobs=True,
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(deltas) == "Streaming works one token at a time."
    assert len(deltas) > 3  # really token by token
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["stop"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 3
    streamed_lp = [
        e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content
    ]
    [call] = gw.client.list_calls(rollout["rollout_id"])
    assert len(streamed_lp) == len(call.response_token_ids) - 1  # every token but the stop token
    assert call.response["content"] == "Streaming works one token at a time."


def test_streaming_tool_calls(make_gateway: Any) -> None:
    gw = make_gateway([TOOL_TURN])
    rollout = gw.rollout()
    stream = sdk(rollout).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "list"}], tools=TOOLS, stream=True
    )
    content, calls, finish = "", {}, None
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            calls[tc.index] = tc
        finish = chunk.choices[0].finish_reason or finish
    assert "<tool_call>" not in content and content == "Let me check."
    assert finish == "tool_calls"
    assert calls[0].function.name == "bash"
    assert json.loads(calls[0].function.arguments) == {"command": "ls -la"}
    [call] = gw.client.list_calls(rollout["rollout_id"])
    assert call.response["tool_calls"][0]["id"] == calls[0].id  # the client saw what was recorded
    assert call.finish_reason == "tool_calls"


@pytest.mark.parametrize(
    "turn",
    [
        {
            "content": "a",
            "tool_calls": [{"name": "bash", "arguments": {}}, {"name": "bash", "arguments": {}}],
        },
        {"content": "Hi  there \n", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]},
        {"content": "No call, trailing space \n"},
    ],
    ids=["two_calls", "spaces_before_a_call", "no_call"],
)
def test_streamed_content_is_the_whole_answers_and_the_recorded_one(make_gateway: Any, turn: Any) -> None:
    """The whitespace around tool-call blocks (the template's newlines) is sent, held or dropped alike
    whole and streamed (``parsers.tools.ContentWhitespace``), so the client gets the same content
    both ways and the store records what it got. The stream used to send the newlines before and
    between the blocks that the whole answer trimmed."""
    gw = make_gateway([turn, turn])
    whole_rollout, stream_rollout = gw.rollout(), gw.rollout()
    request: Any = {"model": "m", "messages": [{"role": "user", "content": "go"}], "tools": TOOLS}
    whole = sdk(whole_rollout).chat.completions.create(**request).choices[0].message.content
    content = ""
    for chunk in sdk(stream_rollout).chat.completions.create(**request, stream=True):
        content += chunk.choices[0].delta.content or "" if chunk.choices else ""
    assert content == (whole or "")
    assert whole == (turn["content"].rstrip() if "tool_calls" in turn else turn["content"])
    for rollout in (whole_rollout, stream_rollout):
        [call] = gw.client.list_calls(rollout["rollout_id"])
        assert call.response["content"] == whole


def test_stream_helper_of_the_sdk(make_gateway: Any) -> None:
    gw = make_gateway([TOOL_TURN])
    rollout = gw.rollout()
    with sdk(rollout).chat.completions.stream(
        model="m", messages=[{"role": "user", "content": "x"}], tools=TOOLS
    ) as s:
        final = s.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.name == "bash"


def test_multi_turn_tool_conversation_extends_token_exactly(make_gateway: Any) -> None:
    turns = [
        TOOL_TURN,
        {
            "content": "",
            "tool_calls": [{"name": "bash", "arguments": {"command": "cat a.txt", "timeout": 5}}],
        },
        {
            "content": "Two at once.",
            "tool_calls": [
                {"name": "bash", "arguments": {"command": "a"}},
                {"name": "bash", "arguments": {"command": "b"}},
            ],
        },
        {"content": "Done: the file says hi."},
        {"content": "Anything else?"},
    ]
    gw = make_gateway(turns)
    rollout = gw.rollout()
    client = sdk(rollout)
    messages: list[Any] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Read a.txt"},
    ]
    for k in range(len(turns)):
        if k % 2:
            with client.chat.completions.stream(model="m", messages=messages, tools=TOOLS) as stream:
                msg = stream.get_final_completion().choices[0].message
        else:
            msg = client.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0].message
        # Harness-style echo: the SDK object's dump (extra null fields), arguments re-serialized.
        echoed = msg.model_dump()
        for tc in echoed.get("tool_calls") or []:
            tc["function"]["arguments"] = json.dumps(json.loads(tc["function"]["arguments"]), indent=1)
        messages.append(echoed)
        if msg.tool_calls:
            for tc in msg.tool_calls:
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": tc.id,
                        "content": [{"type": "text", "text": f"out of {tc.id}"}],
                    }
                )
        else:
            messages.append({"role": "user", "content": "continue"})
    calls = gw.client.list_calls(rollout["rollout_id"])
    assert len(calls) == len(turns)
    assert_extends(calls)
    assert 'harnessrl_prompt_reuse_total{result="reused"} 4.0' in gw.client.metrics()


def test_logprobs_non_streaming(make_gateway: Any) -> None:
    gw = make_gateway(["abc def"])
    resp = sdk(gw.rollout()).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], logprobs=True, top_logprobs=2
    )
    entries = resp.choices[0].logprobs.content
    assert "".join(e.token for e in entries) == "abc def"
    assert all(e.logprob == 0.0 for e in entries)


def test_stop_strings_are_trimmed_and_never_streamed(make_gateway: Any) -> None:
    gw = make_gateway(["Thought: go. Observation: secret text"] * 2)
    rollout = gw.rollout()
    client = sdk(rollout)
    resp = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], stop=["Observation:"]
    )
    assert resp.choices[0].message.content == "Thought: go. "
    assert resp.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "y"}], stop="Observation:", stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "Thought: go. "
    calls = gw.client.list_calls(rollout["rollout_id"])
    # The sampled tokens are kept whole: the token that completed the stop string is recorded.
    assert "Observation" in gw.engine.tokenizer.decode(calls[0].response_token_ids)


def test_max_tokens_cuts_with_length_and_next_call_still_extends(make_gateway: Any) -> None:
    gw = make_gateway(["This reply is much longer than four tokens.", "ok"])
    rollout = gw.rollout()
    client = sdk(rollout)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "x"}]
    first = client.chat.completions.create(model="m", messages=messages, max_completion_tokens=4)
    assert first.choices[0].finish_reason == "length" and first.usage.completion_tokens == 4
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "go on"},
    ]
    client.chat.completions.create(model="m", messages=messages, max_tokens=10)
    calls = gw.client.list_calls(rollout["rollout_id"])
    assert_extends(calls)
    im_end = gw.engine.tokenizer.token_to_id("<|im_end|>")
    assert calls[1].prompt_token_ids[len(calls[0].prompt_token_ids) + 4] == im_end  # the cut turn was closed


def test_completions_with_token_ids_and_text(make_gateway: Any) -> None:
    gw = make_gateway(["Paris.", "Rome."])
    rollout = gw.rollout()
    client = sdk(rollout)
    tok = gw.engine.tokenizer
    ids = tok.encode("<|im_start|>user\nCapital?<|im_end|>\n<|im_start|>assistant\n")
    resp = client.completions.create(model="m", prompt=ids, max_tokens=8, logprobs=1)
    assert resp.choices[0].text == "Paris."
    assert resp.choices[0].logprobs.tokens and len(resp.choices[0].logprobs.token_logprobs) == len(
        resp.choices[0].logprobs.tokens
    )
    stream = client.completions.create(model="m", prompt="The capital of Italy is", stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == "Rome."
    calls = gw.client.list_calls(rollout["rollout_id"])
    assert calls[0].api == "completions" and calls[0].prompt_token_ids == ids
    assert calls[1].prompt_token_ids == tok.encode("The capital of Italy is")


def test_models_and_plain_v1_attribution(make_gateway: Any) -> None:
    gw = make_gateway(["plain"])
    rollout = gw.rollout()
    plain = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=rollout["api_key"], max_retries=0)
    assert [m.id for m in plain.models.list()] == ["scripted"]
    assert (
        plain.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        .choices[0]
        .message.content
        == "plain"
    )
    assert len(gw.client.list_calls(rollout["rollout_id"])) == 1
    # x-api-key works as well as Authorization: Bearer.
    r = httpx.get(f"{rollout['base_url']}/models", headers={"x-api-key": rollout["api_key"]})
    assert r.status_code == 200


def test_litellm(make_gateway: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    gw = make_gateway([TOOL_TURN, "Done."])
    rollout = gw.rollout()
    messages: list[Any] = [{"role": "user", "content": "list files"}]
    resp = litellm.completion(
        model="openai/some-model",
        api_base=rollout["base_url"],
        api_key=rollout["api_key"],
        messages=messages,
        tools=TOOLS,
    )
    msg = resp.choices[0].message
    assert msg.tool_calls[0].function.name == "bash"
    messages += [msg.model_dump(), {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "a.txt"}]
    chunks = list(
        litellm.completion(
            model="openai/some-model",
            api_base=rollout["base_url"],
            api_key=rollout["api_key"],
            messages=messages,
            tools=TOOLS,  # the same tools: a call without them renders another system header
            stream=True,
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Done."
    assert_extends(gw.client.list_calls(rollout["rollout_id"]))
    assert os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"


def test_logprob_entries_carry_each_tokens_utf8_bytes(make_gateway: Any) -> None:
    # Entries are built from a per-token cache: the same token in two answers gets equal entries.
    gw = make_gateway(["héllo wörld", "héllo wörld again"])
    client = sdk(gw.rollout())
    answers = []
    for _ in range(2):
        resp = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], logprobs=True
        )
        entries = resp.choices[0].logprobs.content
        assert entries and all(e.top_logprobs == [] for e in entries)
        # A whole token's bytes are its text's; a token holding part of a character (its text
        # U+FFFD) has that part's bytes, so the entries join to the answer.
        assert all(e.bytes == list(e.token.encode("utf-8")) for e in entries if "\ufffd" not in e.token)
        assert bytes(b for e in entries for b in e.bytes) == resp.choices[0].message.content.encode()
        answers.append([(e.token, e.bytes) for e in entries])
    assert answers[1][: len(answers[0])] == answers[0]
