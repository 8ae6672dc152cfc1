"""The helpers of ``benchmarks/stream_interval.py`` and the fake vLLM's ``stream_interval`` it relies
on; the benchmark itself is run by hand, never as a timed test."""

from __future__ import annotations

import argparse
import json
from types import ModuleType

import pytest
from starlette.testclient import TestClient
from tests.benchmarks.scripts import load_benchmark
from tests.fakes.vllm_server import FakeModel, create_vllm_app

from harnessrl.config import GatewayConfig
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.tokenizer import PolicyTokenizer


@pytest.fixture(scope="module")
def si() -> ModuleType:
    return load_benchmark("stream_interval")


def test_paces_parse_and_a_bad_one_is_refused(si: ModuleType) -> None:
    assert si.parse_pace("0.05:8") == (0.05, 8)
    assert si.parse_pace("0:1") == (0.0, 1)
    for bad in ("0.05", "x:8", "0.05:8:1", "0.05:eight"):
        with pytest.raises(argparse.ArgumentTypeError, match="INTERVAL_S:TOKENS"):
            si.parse_pace(bad)
    assert si.pace_list("0:1,0.05:16") == ["0:1", "0.05:16"]
    with pytest.raises(argparse.ArgumentTypeError, match="0.05-16"):
        si.pace_list("0:1,0.05-16")
    config = GatewayConfig(admin_key="k")
    assert si.default_pace() == f"{config.stream_interval_s:g}:{config.stream_interval_tokens}"


def test_the_reply_is_about_as_long_as_asked_and_ends_with_the_stop_token(si: ModuleType) -> None:
    tokenizer = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    ids = si.reply_ids(128)
    assert 128 <= len(ids) <= 140
    assert tokenizer.decode(ids[-1:]) == "<|im_end|>"
    assert "word0 word1" in tokenizer.decode(ids)


@pytest.mark.parametrize("interval", [None, 1, 4, 16])
def test_the_fake_sends_the_first_token_alone_then_stream_interval_tokens_an_event(
    interval: int | None,
) -> None:
    reply = list(range(100, 123))  # 23 tokens, no stop token: the whole budget
    fake = FakeModel(reply)
    body = {"model": fake.model, "prompt": [1, 2, 3], "max_tokens": 23, "stream": True, "logprobs": 0}
    if interval is not None:
        body["stream_interval"] = interval
    with TestClient(create_vllm_app(fake)) as client:
        text = client.post("/v1/completions", json=body).text
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    sizes = [len(e["choices"][0]["logprobs"]["tokens"]) for e in events]
    assert sizes[-1] == 0 and events[-1]["choices"][0]["finish_reason"] == "length"  # the end, alone
    every = interval or 1
    expected = [1] + [every] * ((23 - 1) // every) + ([(23 - 1) % every] if (23 - 1) % every else [])
    assert sizes[:-1] == expected
    assert fake.stream_intervals == [every]
