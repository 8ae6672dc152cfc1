"""A vLLM server set up otherwise than harnessrl needs is said so, by what is wrong.

``engine.served_model`` names the model every call asks for: one the server does not serve is a
``ConfigError`` at start naming the field and what the server serves. It used to start cleanly (the
first listed model's context length was taken instead) and fail every call with vLLM's 404. A server
without ``VLLM_SERVER_DEV_MODE`` (no ``/pause``: 404) refuses a weight update with an error saying so;
it was reported as one that "did not pause within 300 s" because of requests still running."""

from __future__ import annotations

import asyncio

import pytest
from starlette.routing import Route
from tests.fakes.vllm_server import FakeModel, FakeServer, create_vllm_app, serve_vllm

from harnessrl.config import EngineConfig
from harnessrl.engines.base import SamplingParams, WeightUpdate, collect_samples
from harnessrl.engines.factory import create_engine
from harnessrl.engines.remote import RemoteEngineError
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.engines.vllm import VLLMEngine
from harnessrl.errors import ConfigError
from harnessrl.tokenizer import PolicyTokenizer


@pytest.mark.parametrize("served_model", ["polcy", "policy", None])
def test_a_served_model_the_server_does_not_serve_is_a_config_error_at_start(
    served_model: str | None,
) -> None:
    reply = [5, 6, 2]
    with serve_vllm(reply, model="policy", context_length=512) as server:
        engine = create_engine(
            EngineConfig(
                model=f"vllm:{server.url}", tokenizer="tiny", served_model=served_model, health_interval_s=0
            )
        )

        async def run() -> tuple[list[int], str, int]:
            try:
                await engine.start()
                params = SamplingParams(max_tokens=8, stop_token_ids=(2,))
                ids, _ = await collect_samples(engine.generate([1, 2, 3], params))
                return ids, engine.model_name, engine.context_length
            finally:
                await engine.aclose()

        if served_model == "polcy":
            with pytest.raises(ConfigError, match="engine.served_model 'polcy'.*'policy'"):
                asyncio.run(run())
            assert server.fake.requests == []  # nothing was sent to be refused
        else:  # control: the model it serves, named or by default, answers
            assert asyncio.run(run()) == (reply, "policy", 512)


@pytest.mark.parametrize("dev_mode", [False, True])
def test_a_weight_update_on_a_server_without_dev_mode_says_so(dev_mode: bool) -> None:
    fake = FakeModel([5, 6, 2])
    app = create_vllm_app(fake)
    if not dev_mode:  # vLLM without VLLM_SERVER_DEV_MODE has no /pause (nor /collective_rpc)
        app.router.routes = [
            r for r in app.router.routes if not (isinstance(r, Route) and r.path == "/pause")
        ]
    tokenizer = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))

    async def update(url: str) -> int:
        engine = VLLMEngine(url, tokenizer)
        await engine.start()
        try:
            await engine.update_weights(WeightUpdate(version=1, checkpoint_dir="/ckpt/1"))
        finally:
            await engine.aclose()
        return engine.policy_version

    with FakeServer(app, fake) as server:
        if dev_mode:  # control: the same server with /pause takes the update
            assert asyncio.run(update(server.url)) == 1
        else:
            with pytest.raises(
                RemoteEngineError, match="has no /pause: start it with VLLM_SERVER_DEV_MODE=1"
            ) as info:
                asyncio.run(update(server.url))
            assert "within" not in str(info.value)  # not blamed on requests that did not finish
            assert [path for path, _ in fake.calls] == ["/resume"]  # resumed; nothing reloaded
