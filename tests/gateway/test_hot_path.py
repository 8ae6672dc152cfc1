"""The gateway's per-call shortcuts give exactly what the long way gives.

- ``key_messages`` reuses the previous request's normalized messages and keys only for messages
  that are the same JSON (types included), and still refuses a bad new message;
- ``quick_prompt`` (the event-loop path) is ``build_prompt``'s result, or ``None``;
- ``CallHistory.record`` with precomputed keys remembers the same ``PriorCall`` as from the store;
- ``Generation.run`` (one decode at the end) gives the text ``pieces`` (incremental decode) gives;
- through a real gateway in front of the vLLM fake, streaming and non-streaming clients record the
  same calls, and only a non-streaming call without stop strings lets the engine skip streaming;
- request bodies orjson refuses (``NaN``) are refused with a 400, as strict JSON (issue 19), and
  nothing is recorded.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.fakes.vllm_server import serve_vllm

from harnessrl.chat_template import TemplateInputs
from harnessrl.config import GatewayConfig
from harnessrl.engines.base import GenerationContext, Samples, SamplingParams, each_sample, through_first_stop
from harnessrl.engines.scripted import ScriptedEngine, render_turn
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.engines.vllm import VLLMEngine
from harnessrl.errors import BadRequest
from harnessrl.gateway import create_app
from harnessrl.gateway.parsers.tools import parse_tool_calls
from harnessrl.gateway.pipeline.generation import Generation, Piece
from harnessrl.gateway.prompt.conversation import VERIFY_CALLS, SpliceTrust, build_prompt, quick_prompt
from harnessrl.gateway.prompt.history import CallHistory, prior_from_call
from harnessrl.gateway.prompt.messages import (
    PriorCall,
    key_messages,
    message_key,
    normalize_messages,
    template_key,
)
from harnessrl.gateway.server import serve_in_thread
from harnessrl.schemas import Call
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

from .conftest import ADMIN_KEY

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def _history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": [{"type": "text", "text": "Fix the bug."}]},
    ]
    for k in range(turns):
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": '{"n": 1}'}}
                ],
            },
            {"role": "tool", "tool_call_id": f"c{k}", "content": f"output {k}\n"},
        ]
    return messages


# -- key_messages ---------------------------------------------------------------------------------


def test_key_messages_with_reuse_equals_keying_from_scratch() -> None:
    first = _history(3)
    second = _history(4)
    previous = key_messages(first)
    reused = key_messages(second, previous)
    fresh = key_messages(second)
    assert reused == fresh
    assert reused.messages == normalize_messages(second)
    assert reused.keys == tuple(message_key(m) for m in normalize_messages(second))
    # The repeated prefix shares the previous request's work (the same objects, not recomputed).
    assert all(a is b for a, b in zip(reused.keys[: len(first)], previous.keys, strict=False))


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m[3].update(content="edited output"),  # history edited in place
        lambda m: m[2]["tool_calls"][0]["function"].update(arguments={"n": 1.0}),  # 1 -> 1.0
        lambda m: m[2]["tool_calls"][0]["function"].update(arguments={"n": True}),  # 1 -> true
    ],
)
def test_key_messages_recomputes_messages_that_changed(edit: Any) -> None:
    before = _history(3)
    before[2]["tool_calls"][0]["function"]["arguments"] = {"n": 1}
    previous = key_messages(before)
    after = json.loads(json.dumps(before))
    edit(after)
    reused, fresh = key_messages(after, previous), key_messages(after)
    assert reused.keys == fresh.keys and reused.keys != previous.keys
    # Compared as JSON: Python's == has 1 == 1.0 == True, the chat template does not.
    assert json.dumps(reused.messages) == json.dumps(fresh.messages) != json.dumps(previous.messages)


def test_key_messages_still_refuses_a_bad_new_message() -> None:
    previous = key_messages(_history(1))
    bad = [*_history(1), {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(BadRequest) as err:
        key_messages(bad, previous)
    assert err.value.param == "messages.4.content.0"


# -- quick_prompt and build_prompt ----------------------------------------------------------------


def _answer(tokenizer: PolicyTokenizer, k: int) -> tuple[list[int], dict[str, Any]]:
    turn = {"content": f"Step {k}.", "tool_calls": [{"name": "bash", "arguments": {"command": f"ls {k}"}}]}
    ids = tokenizer.encode(render_turn(turn))
    parsed = parse_tool_calls(tokenizer.decode(ids[:-1]))
    message = {
        "role": "assistant",
        "content": parsed.content,
        "tool_calls": [c.to_openai() for c in parsed.tool_calls],
    }
    return ids, message


def test_quick_prompt_is_build_prompt_once_trusted_else_none() -> None:
    tokenizer = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    trust = SpliceTrust()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Fix it."},
    ]
    priors: list[PriorCall] = []
    previous = None
    quick_results = []
    for k in range(VERIFY_CALLS + 4):
        keyed = key_messages(messages, previous)
        previous = keyed
        quick = quick_prompt(tokenizer, keyed.messages, priors, keyed.keys, tools=TOOLS, trust=trust)
        plan = build_prompt(tokenizer, keyed.messages, priors, tools=TOOLS, keys=keyed.keys, trust=trust)
        reference = build_prompt(tokenizer, keyed.messages, priors, tools=TOOLS, incremental=False)
        assert plan.prompt_ids == reference.prompt_ids
        if quick is not None:
            assert quick == plan
        quick_results.append(quick is not None)
        ids, answer = _answer(tokenizer, k)
        priors.append(
            PriorCall.from_keys(keyed.keys, answer, plan.prompt_ids, ids, template_key(TOOLS, None))
        )
        tool_id = answer["tool_calls"][0]["id"]
        messages = [*messages, answer, {"role": "tool", "tool_call_id": tool_id, "content": f"out {k}"}]
    # No prior for the first call; then VERIFY_CALLS calls are checked the full way (build_prompt's
    # job, off the loop); after that every call is cheap.
    assert quick_results == [False] * (1 + VERIFY_CALLS) + [True] * 3


def test_record_with_keys_remembers_what_the_store_would_give(tmp_path: Path) -> None:
    tokenizer = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    store = SQLiteStore(tmp_path / "s.db")
    try:
        rollout = store.create_rollout()
        messages = _history(2)
        ids, answer = _answer(tokenizer, 0)
        call = store.add_call(
            Call(
                rollout_id=rollout.rollout_id,
                request={"messages": messages},
                response=answer,
                prompt_token_ids=[1, 2, 3],
                response_token_ids=ids,
                response_logprobs=[0.0] * len(ids),
            )
        )
        history = CallHistory(store)
        history.record(call, key_messages(messages).keys)
        memory = asyncio.run(history.get(rollout.rollout_id, 0))
        assert memory.priors == {call.seq: prior_from_call(call)}
    finally:
        store.close()


# -- Generation.run vs pieces ---------------------------------------------------------------------


class ListEngine:
    """Yields a fixed token list (an Engine-protocol fake: the seam is the constructor argument)."""

    def __init__(
        self, tokenizer: PolicyTokenizer, ids: Sequence[int], batch: int = 3, past_stop: bool = False
    ):
        self.tokenizer = tokenizer
        self.ids = list(ids)
        self.batch = batch
        self.past_stop = past_stop  # go on past a stop token (a misbehaving engine)
        self.model_name, self.context_length, self.policy_version = "list", 4096, 7
        self.contexts: list[GenerationContext | None] = []

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, context: GenerationContext | None = None
    ) -> AsyncIterator[Samples]:
        self.contexts.append(context)
        ids = self.ids[: params.max_tokens]
        if not self.past_stop:
            ids = ids[: through_first_stop(ids, params.stop_token_ids)]
        for k in range(0, len(ids), self.batch):  # a few tokens per batch, as one network read
            yield Samples(ids[k : k + self.batch], [-i / 10 for i in range(k, min(k + self.batch, len(ids)))])


@pytest.mark.parametrize("batch", [1, 2, 5, 100])
@pytest.mark.parametrize("stops", [[], ["never"]])
def test_an_engine_batch_that_goes_past_its_stop_token_ends_at_it(batch: int, stops: list[str]) -> None:
    """The tokens after a stop token are no part of the answer, whether they come in the stop token's
    batch or a later one, streamed (``batches``) or whole (``run``)."""
    tokenizer = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    stop_id = tokenizer.stop_token_ids[0]
    head = tokenizer.encode("Before the stop")
    ids = [*head, stop_id, *tokenizer.encode(" and after it")]
    params = SamplingParams(max_tokens=len(ids), stop_token_ids=(stop_id,))

    async def both() -> tuple[Generation, Generation, list[Piece]]:
        engine = ListEngine(tokenizer, ids, batch=batch, past_stop=True)
        whole = await Generation(engine, [1], params, stops).run()  # type: ignore[arg-type]
        streamed = Generation(engine, [1], params, stops)  # type: ignore[arg-type]
        pieces = [piece async for pieces in streamed.batches() for piece in pieces]
        return whole, streamed, pieces

    whole, streamed, pieces = asyncio.run(both())
    for gen in (whole, streamed):
        assert gen.token_ids == [*head, stop_id] and gen.finish_reason == "stop"
        assert gen.text == "Before the stop"
    assert [p.token_id for p in pieces] == [*head, stop_id]
    assert [p.is_stop_token for p in pieces] == [False] * len(head) + [True]
    assert "".join(p.text for p in pieces) == "Before the stop"


def _byte_tokens(tokenizer: PolicyTokenizer, text: str) -> list[int]:
    """One token per UTF-8 byte (byte-level BPE's base alphabet): splits multi-byte characters."""
    table = {b: c for b, c in zip(range(256), _bytes_to_unicode(), strict=True)}
    ids = [tokenizer.token_to_id(table[b]) for b in text.encode()]
    assert None not in ids
    return ids  # type: ignore[return-value]


def _bytes_to_unicode() -> list[str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs, strict=True))]


@pytest.mark.parametrize("ending", ["stop_token", "max_tokens", "stop_string"])
def test_run_without_incremental_decoding_gives_what_pieces_give(ending: str) -> None:
    tokenizer = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    stop_id = tokenizer.stop_token_ids[0]
    ids = [
        *tokenizer.encode("Grüße 世界"),
        *_byte_tokens(tokenizer, "🚀é"),
        *tokenizer.encode(" <tool_call> END tail"),
        *_byte_tokens(tokenizer, "世"),
    ]
    stops: list[str] = []
    if ending == "stop_token":
        ids.append(stop_id)
    elif ending == "stop_string":
        stops = ["END"]
    params = SamplingParams(
        max_tokens=len(ids) - (1 if ending == "max_tokens" else 0), stop_token_ids=(stop_id,)
    )

    async def both() -> tuple[Generation, Generation]:
        engine = ListEngine(tokenizer, ids)
        fast = await Generation(engine, [1], params, stops).run()  # type: ignore[arg-type]
        slow = Generation(engine, [1], params, stops)  # type: ignore[arg-type]
        async for pieces in slow.batches():
            assert isinstance(pieces, list) and all(isinstance(p, Piece) for p in pieces)
            streamed.extend(pieces)
        return fast, slow

    streamed: list[Piece] = []
    fast, slow = asyncio.run(both())
    for name in ("text", "token_ids", "logprobs", "finish_reason", "policy_version"):
        assert getattr(fast, name) == getattr(slow, name), name
    # What a streaming client is sent is the text recorded, the held-back last character included.
    assert "".join(p.text for p in streamed) == slow.text
    assert fast.first_token_at is not None and fast.finished_at is not None
    expected = {"stop_token": "stop", "max_tokens": "length", "stop_string": "stop"}[ending]
    assert fast.finish_reason == expected


# -- through the gateway --------------------------------------------------------------------------


def test_streaming_and_whole_clients_record_the_same_calls_through_vllm(tmp_path: Path) -> None:
    tokenizer = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    reply = tokenizer.encode(
        render_turn({"content": "Looking.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]})
    )
    with serve_vllm(reply, context_length=4096) as upstream:
        store = SQLiteStore(tmp_path / "s.db")
        app = create_app(GatewayConfig(admin_key=ADMIN_KEY), store, VLLMEngine(upstream.url, tokenizer))
        try:
            with serve_in_thread(app) as url, httpx.Client(timeout=30) as http:
                calls = {}
                for stream in (False, True):
                    r = http.post(
                        f"{url}/api/rollouts", json={}, headers={"authorization": f"Bearer {ADMIN_KEY}"}
                    ).json()
                    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
                    for k in range(3):
                        body = {"messages": messages, "tools": TOOLS, "logprobs": True, "stream": stream}
                        resp = http.post(
                            f"{r['base_url']}/chat/completions",
                            json=body,
                            headers={"authorization": f"Bearer {r['api_key']}"},
                        )
                        assert resp.status_code == 200, resp.text
                        if stream:
                            assert resp.text.rstrip().endswith("data: [DONE]")
                            answer = store.list_calls(r["rollout_id"])[-1].response
                        else:
                            choice = resp.json()["choices"][0]
                            answer = choice["message"]
                            assert choice["finish_reason"] == "tool_calls"
                            assert len(choice["logprobs"]["content"]) == len(reply) - 1  # not the stop token
                            assert [e["token"] for e in choice["logprobs"]["content"]] == [
                                tokenizer.decode([t]) for t in reply[:-1]
                            ]
                        messages = [
                            *messages,
                            answer,
                            {
                                "role": "tool",
                                "tool_call_id": answer["tool_calls"][0]["id"],
                                "content": f"r{k}",
                            },
                        ]
                    calls[stream] = store.list_calls(r["rollout_id"])
            sent = list(upstream.fake.prompts)
        finally:
            store.close()
    whole, streamed = calls[False], calls[True]
    assert len(whole) == len(streamed) == 3
    # The engine conditioned on exactly the recorded prompts (their JSON comes from the previous
    # call's, ``TokenIds``, once incremental splicing is trusted: the streamed rollout's).
    assert sent == [c.prompt_token_ids for c in [*whole, *streamed]]
    for a, b in zip(whole, streamed, strict=True):
        assert a.prompt_token_ids == b.prompt_token_ids
        assert a.response_token_ids == b.response_token_ids == reply
        assert a.response_logprobs == b.response_logprobs
        assert a.finish_reason == b.finish_reason == "tool_calls"
        assert a.response["content"] == b.response["content"]
    for prev, nxt in zip(whole, whole[1:], strict=False):  # sampled-token reuse still holds
        assert (
            nxt.prompt_token_ids[: len(prev.prompt_token_ids) + len(reply)] == prev.prompt_token_ids + reply
        )


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


def test_engine_is_told_to_stream_only_when_someone_needs_it(tmp_path: Path) -> None:
    tokenizer = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    engine = RecordingEngine(["Hello there, a scripted answer."] * 4, tokenizer)
    store = SQLiteStore(tmp_path / "s.db")
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), store, engine)
    try:
        with serve_in_thread(app) as url, httpx.Client(timeout=30) as http:
            admin = {"authorization": f"Bearer {ADMIN_KEY}"}
            rollout = http.post(f"{url}/api/rollouts", json={}, headers=admin).json()
            headers = {"authorization": f"Bearer {rollout['api_key']}"}
            for extra in ({}, {"stream": True}, {"stop": ["zzz"]}, {"stream": True, "stop": ["zzz"]}):
                body = {"messages": [{"role": "user", "content": "hi"}], **extra}
                resp = http.post(f"{rollout['base_url']}/chat/completions", json=body, headers=headers)
                assert resp.status_code == 200, resp.text
    finally:
        store.close()
    # Only a non-streaming call without stop strings lets the engine answer in one piece; a streamed
    # one is read at gateway.stream_interval_s.
    contexts = [c for c in engine.contexts if c is not None]
    assert [c.stream for c in contexts] == [False, True, True, True]
    config = GatewayConfig(admin_key=ADMIN_KEY)
    interval = config.stream_interval_s
    assert interval > 0 and [c.stream_interval_s for c in contexts] == [0.0, interval, interval, interval]
    assert [c.stream_interval_tokens for c in contexts] == [config.stream_interval_tokens] * 4


def _sse_chunks(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def test_a_stream_read_at_an_interval_sends_the_same_answer_in_fewer_events(tmp_path: Path) -> None:
    """Through the gateway to the fake vLLM sending a token every 10 ms: gathered by the gateway
    (stream_interval_s) or sent four tokens an event by vLLM (stream_interval_tokens), the client
    gets the tokens in fewer chunks, with the same text, logprobs and record as a token at a time."""
    tokenizer = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    reply = tokenizer.encode(render_turn({"content": "One two three four five six seven eight nine ten."}))
    paces = {"each": (0.0, 1), "gathered": (0.1, 1), "fours": (0.0, 4)}
    results = {}
    with serve_vllm(reply, context_length=4096) as upstream:
        upstream.fake.token_delay_s = 0.01
        for name, (interval, tokens) in paces.items():
            store = SQLiteStore(tmp_path / f"{name}.db")
            config = GatewayConfig(
                admin_key=ADMIN_KEY, stream_interval_s=interval, stream_interval_tokens=tokens
            )
            app = create_app(config, store, VLLMEngine(upstream.url, tokenizer))
            try:
                with serve_in_thread(app) as url, httpx.Client(timeout=30) as http:
                    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
                    r = http.post(f"{url}/api/rollouts", json={}, headers=admin).json()
                    body = {
                        "messages": [{"role": "user", "content": "count"}],
                        "logprobs": True,
                        "stream": True,
                    }
                    resp = http.post(
                        f"{r['base_url']}/chat/completions",
                        json=body,
                        headers={"authorization": f"Bearer {r['api_key']}"},
                    )
                    assert resp.status_code == 200 and resp.text.rstrip().endswith("data: [DONE]")
                    results[name] = (_sse_chunks(resp.text), store.list_calls(r["rollout_id"])[0])
            finally:
                store.close()
        asked = list(upstream.fake.stream_intervals)
    assert asked == [1, 1, 4]  # vLLM's per-request stream_interval, sent only when above 1

    def content(chunks: list[dict[str, Any]]) -> tuple[str, list[str]]:
        deltas = [c["choices"][0] for c in chunks if c["choices"]]
        text = "".join(d["delta"].get("content") or "" for d in deltas)
        tokens = [e["token"] for d in deltas if d.get("logprobs") for e in d["logprobs"]["content"]]
        return text, tokens

    def text_chunks(name: str) -> int:
        return sum(1 for c in results[name][0] if c["choices"] and c["choices"][0]["delta"].get("content"))

    each_chunks, each_call = results["each"]
    assert content(each_chunks)[0] == "One two three four five six seven eight nine ten."
    for name in ("gathered", "fours"):
        chunks, call = results[name]
        assert content(chunks) == content(each_chunks)
        assert call.response_token_ids == each_call.response_token_ids == reply
        assert call.response_logprobs == each_call.response_logprobs
        assert call.response == each_call.response
    # ~15 tokens 10 ms apart: a chunk per token or two a token at a time, a few gathered at 100 ms,
    # one per four tokens (the first alone) from vLLM.
    assert text_chunks("gathered") <= 4 < text_chunks("each")
    assert text_chunks("fours") <= (len(reply) + 3) // 4 + 1 < text_chunks("each")


def test_body_with_nan_is_refused_before_anything_is_recorded(make_gateway: Any) -> None:
    gw = make_gateway(["ok"])
    rollout = gw.rollout()
    raw = b'{"messages": [{"role": "user", "content": "hi"}], "metadata": {"score": NaN}}'
    with httpx.Client(timeout=30) as http:
        resp = http.post(
            f"{rollout['base_url']}/chat/completions",
            content=raw,
            headers={"authorization": f"Bearer {rollout['api_key']}", "content-type": "application/json"},
        )
        bad = http.post(
            f"{rollout['base_url']}/chat/completions",
            content=b'{"messages": [',
            headers={"authorization": f"Bearer {rollout['api_key']}", "content-type": "application/json"},
        )
    assert resp.status_code == 400, resp.text
    assert "NaN and Infinity are not JSON numbers" in resp.json()["error"]["message"]
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
    assert gw.client.list_calls(rollout["rollout_id"]) == []


def test_token_texts_are_single_token_decodes() -> None:
    tokenizer = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    ids = [
        *tokenizer.encode("héllo <|im_end|> 世界"),
        *_byte_tokens(tokenizer, "🚀"),
        *tokenizer.stop_token_ids,
    ]
    assert tokenizer.token_texts(ids) == [tokenizer.decode([t]) for t in ids]
    assert tokenizer.token_texts(ids) == [tokenizer.decode([t]) for t in ids]  # from the cache


def test_scripted_engine_ignores_the_stream_hint() -> None:
    tokenizer = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    engine = ScriptedEngine(["same either way"], tokenizer)

    async def run(stream: bool) -> list[int]:
        ctx = GenerationContext("r", stream=stream)
        return [
            s.token_id async for s in each_sample(engine.generate([1], SamplingParams(max_tokens=50), ctx))
        ]

    assert asyncio.run(run(True)) == asyncio.run(run(False))


def test_rendering_with_cached_tools_follows_every_change_of_the_tools() -> None:
    tokenizer = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    first = tokenizer.render_chat(messages, tools=TOOLS)
    assert tokenizer.render_chat(messages, tools=json.loads(json.dumps(TOOLS))) == first  # a cache hit
    changed = json.loads(json.dumps(TOOLS))
    changed[0]["function"]["description"] = "Run a different command"
    assert "Run a different command" in tokenizer.render_chat(messages, tools=changed)
    assert tokenizer.render_chat(messages, tools=TOOLS) == first
    for k in range(40):  # many distinct tool lists: the cache stays bounded and every render is right
        tools = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "name": f"tool_{k}"}}]
        assert f'"name": "tool_{k}"' in tokenizer.render_chat(messages, tools=tools)
    assert len(tokenizer._template_inputs._tools) <= TemplateInputs.MAX_TOOL_LISTS
