"""Smoke test of ``benchmarks/merge_rate.py``: its core functions on a few short rollouts (not a timed test).

Records a handful of tool-calling rollouts through a real gateway (scripted engine, 127.0.0.1), then
checks the two merge rules: harnessrl keeps every append-only rollout one sample, and the Agent
Lightning rule splits exactly where a retokenized prompt stops extending the previous call.
"""

from __future__ import annotations

import json
from types import ModuleType

import pytest
from tests.benchmarks.scripts import load_benchmark

from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.schemas import Call
from harnessrl.tokenizer import PolicyTokenizer


@pytest.fixture(scope="module")
def merge_rate() -> ModuleType:
    return load_benchmark("merge_rate")


def _call(seq: int, messages: list[dict], prompt: list[int], response: list[int]) -> Call:
    return Call(
        rollout_id="r",
        seq=seq,
        request={"messages": messages},
        response={"role": "assistant", "content": "x"},
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_logprobs=[0.0] * len(response),
    )


def test_agl_rule_splits_on_retokenization_drift(merge_rate: ModuleType) -> None:
    tok = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    end = tok.token_to_id("<|im_end|>")
    user = [{"role": "user", "content": "hi"}]
    follow = [*user, {"role": "assistant", "content": "Hello there"}, {"role": "user", "content": "more"}]
    canonical = tok.encode("Hello there") + [end]
    # The same text sampled as other token IDs (decoding is not injective).
    drifted = tok.encode("Hello") + tok.encode(" th") + tok.encode("ere") + [end]
    assert tok.decode(drifted) == tok.decode(canonical) and drifted != canonical

    def calls(answer: list[int]) -> list[Call]:
        return [
            _call(0, user, tok.encode_chat(user), answer),
            _call(1, follow, tok.encode_chat(follow), [end]),
        ]

    assert merge_rate.agl_rule_samples(calls(canonical), tok) == 1
    assert merge_rate.agl_rule_samples(calls(drifted), tok) == 2


def test_tool_calling_family_end_to_end(merge_rate: ModuleType) -> None:
    traces = merge_rate.record_family("tool_calling", 3, seed=1, quick=True)
    assert len(traces.records) == 3
    assert all(len(r.calls) >= 2 for r in traces.records)
    result = merge_rate.measure(traces)
    assert result["harnessrl"]["samples_per_rollout"] == 1.0  # append-only: one chain per rollout
    assert result["agl_rule"]["samples_per_rollout"] >= 1.0
    assert result["gateway_prompt_reuse"].get("no_match", 0) == 0
    assert set(result["harnessrl"]["breaks"]) >= {"prefix_mismatch", "history_edited"}
    json.dumps(result)  # the result must be JSON-serializable


def test_tool_outputs_are_varied(merge_rate: ModuleType) -> None:
    import random

    rng = random.Random(0)
    outputs = [merge_rate.tool_output(rng) for _ in range(200)]
    assert any("Traceback" in o or "FAILED" in o for o in outputs)
    assert any(any(ord(ch) > 127 for ch in o) for o in outputs)
    assert max(len(line) for o in outputs for line in o.splitlines() or [""]) > 300  # long lines
    turns = merge_rate.scripted_turns(rng, 6)
    assert len(turns) == 6 and not turns[-1].get("tool_calls") and all(t["tool_calls"] for t in turns[:-1])


def test_reasoning_family_on_a_template_that_drops_earlier_reasoning(merge_rate: ModuleType) -> None:
    """Reasoning turns sent back every way on a Qwen3-style template: still one chain per rollout,
    while retokenizing what the harness sent splits after each reasoning turn."""
    traces = merge_rate.record_family("reasoning", 4, seed=2, quick=True)
    result = merge_rate.measure(traces)
    assert result["harnessrl"]["samples_per_rollout"] == 1.0
    assert result["agl_rule"]["samples_per_rollout"] > 1.0
    assert result["gateway_prompt_reuse"].get("mismatch", 0) == 0
    assert {r.plan.reasoning_back for r in traces.records} - {"litellm", "dropped", "verbatim"} == set()
