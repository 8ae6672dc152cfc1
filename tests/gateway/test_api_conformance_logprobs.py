"""Chat ``logprobs`` entries' ``bytes`` through the official SDK against a real gateway on 127.0.0.1:
OpenAI documents them as the token's UTF-8 bytes, the way to rebuild a character that several tokens
share. Found on a live gateway: each such token's entry said U+FFFD's bytes (``[239, 191, 189]``),
so the joined bytes were not the answer's text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest

SPLIT = "héllo 🎉 wörld 你好 𝔘"  # the tiny tokenizer splits é, 🎉, ö, 你, 好 and 𝔘 over several tokens
WHOLE = "hello world, plain ASCII"  # control: every token is whole UTF-8


def _entries(sdk: openai.OpenAI, stream: bool) -> tuple[str, list[Any]]:
    args: dict[str, Any] = dict(model="m", messages=[{"role": "user", "content": "hi"}], logprobs=True)
    if not stream:
        answer = sdk.chat.completions.create(**args)
        assert answer.choices[0].logprobs is not None and answer.choices[0].logprobs.content is not None
        return answer.choices[0].message.content or "", answer.choices[0].logprobs.content
    text, entries = "", []
    for chunk in sdk.chat.completions.create(stream=True, **args):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs is not None and choice.logprobs.content:
                entries += choice.logprobs.content
    return text, entries


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("text", [SPLIT, WHOLE])
def test_logprob_bytes_join_to_the_answer(make_gateway: Callable[..., Any], text: str, stream: bool) -> None:
    gw = make_gateway([text] * 4)
    rollout = gw.rollout()
    sdk = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
    content, entries = _entries(sdk, stream)
    assert content == text
    assert (
        len(entries) == len(gw.store.list_calls(rollout["rollout_id"])[0].response_token_ids) - 1
    )  # no stop
    assert b"".join(bytes(e.bytes or []) for e in entries) == text.encode("utf-8")
    for entry in entries:  # a whole token's bytes are its text's
        if "\ufffd" not in entry.token:
            assert bytes(entry.bytes or []) == entry.token.encode("utf-8")
    if text == SPLIT:  # the case this is about: some tokens hold part of a character
        assert any("\ufffd" in e.token for e in entries)
