"""``[engine] request_seeds`` holds for every engine a config makes, not only vLLM.

A harness that sends one fixed ``seed`` on every call (some do, for "reproducible" runs) got one and
the same answer for every rollout of a group from the embedded and SGLang engines, which always used
it: a group of equal rewards, zero advantage, nothing learned. vLLM's engine dropped it already.
"""

from __future__ import annotations

import asyncio

import pytest
from tests.fakes.sglang_server import create_sglang_app
from tests.fakes.vllm_server import FakeModel, FakeServer

from harnessrl.config import EngineConfig
from harnessrl.engines.base import Engine, SamplingParams, collect_samples
from harnessrl.engines.factory import create_engine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.tokenizer import PolicyTokenizer


async def _answers(engine: Engine, params: SamplingParams, n: int) -> list[list[int]]:
    await engine.start()
    try:
        return [(await collect_samples(engine.generate([5, 6, 7, 8], params)))[0] for _ in range(n)]
    finally:
        await engine.aclose()


@pytest.mark.parametrize("mode", ["drop", "pass"])
def test_the_embedded_engine_a_config_makes_follows_request_seeds(mode: str) -> None:
    engine = create_engine(EngineConfig(model="tiny", request_seeds=mode))  # type: ignore[arg-type]
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=7)
    answers = asyncio.run(_answers(engine, params, 4))
    if mode == "pass":
        assert all(a == answers[0] for a in answers)  # the control: one seed, one answer
    else:
        # Four 24-token samples at temperature 1 from the tiny model: all equal only if seeded alike.
        assert len({tuple(a) for a in answers}) > 1


@pytest.mark.parametrize("mode", ["drop", "pass", None])
def test_the_sglang_engine_a_config_makes_follows_request_seeds(mode: str | None) -> None:
    tokenizer = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    reply = [*tokenizer.encode("hi"), tokenizer.token_to_id("<|im_end|>")]
    fake = FakeModel(reply, model="policy")
    server = FakeServer(create_sglang_app(fake), fake).start()
    try:
        fields = {} if mode is None else {"request_seeds": mode}
        engine = create_engine(EngineConfig(model=f"sglang:{server.url}", tokenizer="tiny", **fields))
        asyncio.run(_answers(engine, SamplingParams(max_tokens=4, seed=7), 1))
    finally:
        server.kill()
    sent = [r["sampling_params"].get("sampling_seed") for r in fake.requests]
    assert sent == [7 if mode == "pass" else None]  # the default (None) drops it, as vLLM's does
