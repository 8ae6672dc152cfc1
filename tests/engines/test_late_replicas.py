"""A replica that is down when its pool starts is marked unhealthy and the pool starts without it.
When it comes up, the health check must discover it as ``start`` would have (served model, context
length, vLLM's logprobs mode) before it takes a call: it used to be re-admitted undiscovered, its calls
asking vLLM for the model ``"unknown"`` (a 404 that failed them) on a server whose logprobs mode
nobody had checked, and SGLang's served under the tokenizer's context length instead of the server's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from tests.fakes.sglang_server import create_sglang_app
from tests.fakes.vllm_server import FakeModel, FakeServer, create_vllm_app

from harnessrl.engines import sglang as sglang_module
from harnessrl.engines import vllm as vllm_module
from harnessrl.engines.base import GenerationContext, SamplingParams, collect_samples
from harnessrl.engines.pool import EnginePool
from harnessrl.engines.sglang import SGLangEngine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.engines.vllm import VLLMEngine
from harnessrl.tokenizer import PolicyTokenizer


@pytest.fixture(scope="module")
def tokenizer() -> PolicyTokenizer:
    return PolicyTokenizer.from_dir(tiny_model_dir(weights=False))


@pytest.fixture
def reply(tokenizer: PolicyTokenizer) -> list[int]:
    return [*tokenizer.encode("hello there"), tokenizer.token_to_id("<|im_end|>")]


@pytest.fixture
def servers() -> Iterator[list[FakeServer]]:
    made: list[FakeServer] = []
    yield made
    for server in made:
        server.kill()


def _server(servers: list[FakeServer], app: Any, fake: FakeModel) -> FakeServer:
    """A server bound to its port but not listening yet (``start`` makes it listen): down."""
    server = FakeServer(app, fake)
    servers.append(server)
    return server


async def _calls(pool: EnginePool, reply: list[int], n: int) -> None:
    params = SamplingParams(max_tokens=16, stop_token_ids=(reply[-1],))
    for i in range(n):  # rollouts spread over the ring: about half prefer each replica
        ids, _ = await collect_samples(
            pool.generate([5, 6, 7], params, GenerationContext(rollout_id=f"r{i}"))
        )
        assert ids == reply


@pytest.mark.parametrize("mode", ["processed_logprobs", "raw_logprobs"])
def test_a_vllm_replica_down_at_start_is_discovered_and_checked_before_it_serves(
    tokenizer: PolicyTokenizer, reply: list[int], servers: list[FakeServer], mode: str
) -> None:
    up_fake, late_fake = FakeModel(reply, model="policy"), FakeModel(reply, model="policy")
    late_fake.logprobs_mode = mode
    up = _server(servers, create_vllm_app(up_fake), up_fake).start()
    late = _server(servers, create_vllm_app(late_fake), late_fake)

    async def run() -> None:
        late_engine = VLLMEngine(late.url, tokenizer)
        pool = EnginePool([VLLMEngine(up.url, tokenizer), late_engine], health_interval_s=0)
        await pool.start()
        try:
            assert [r.healthy for r in pool.replicas] == [True, False]
            late.start()
            await pool.check_health()
            if mode == "processed_logprobs":  # found, discovered, and serving the right model
                assert pool.replicas[1].healthy
                assert late_engine.model_name == "policy" and late_engine.logprobs_mode == mode
            else:  # a server that would record the wrong logprobs never serves
                assert not pool.replicas[1].healthy
            await _calls(pool, reply, 24)
        finally:
            await pool.aclose()

    asyncio.run(run())
    asked = {body.get("model") for body in late_fake.requests}
    assert asked == ({"policy"} if mode == "processed_logprobs" else set())
    assert up_fake.requests  # control: the calls ran, some on the replica that was up throughout


def test_an_sglang_replica_down_at_start_gets_the_servers_context_length(
    tokenizer: PolicyTokenizer, reply: list[int], servers: list[FakeServer]
) -> None:
    up_fake = FakeModel(reply, model="policy", context_length=512)
    late_fake = FakeModel(reply, model="policy", context_length=512)
    up = _server(servers, create_sglang_app(up_fake), up_fake).start()
    late = _server(servers, create_sglang_app(late_fake), late_fake)

    async def run() -> None:
        late_engine = SGLangEngine(late.url, tokenizer)
        pool = EnginePool([SGLangEngine(up.url, tokenizer), late_engine], health_interval_s=0)
        await pool.start()
        try:
            assert late_engine.context_length != 512  # the tokenizer's, for now: not discovered
            late.start()
            await pool.check_health()
            assert pool.replicas[1].healthy
            assert (late_engine.model_name, late_engine.context_length) == ("policy", 512)
            assert pool.context_length == 512
            await _calls(pool, reply, 24)
        finally:
            await pool.aclose()

    asyncio.run(run())
    assert late_fake.requests and up_fake.requests  # control: both replicas served


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_a_replica_that_accepts_but_never_answers_does_not_hold_up_the_pools_start(
    tokenizer: PolicyTokenizer,
    reply: list[int],
    servers: list[FakeServer],
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Discovery is bounded by ``DISCOVERY_TIMEOUT_S``, not by ``request_timeout_s`` (the longest
    silence of a generation): a wedged server held the engine's start, so the gateway's, that long."""
    # The bound shortened so the test waits 2 s, not 30; each engine module holds its own name.
    monkeypatch.setattr(vllm_module, "DISCOVERY_TIMEOUT_S", 2.0)
    monkeypatch.setattr(sglang_module, "DISCOVERY_TIMEOUT_S", 2.0)
    fake = FakeModel(reply, model="policy")
    app, cls = (
        (create_vllm_app(fake), VLLMEngine) if kind == "vllm" else (create_sglang_app(fake), SGLangEngine)
    )
    up = _server(servers, app, fake).start()
    accepted = asyncio.Event()

    async def wedged(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        await reader.read()  # reads the request, never answers; ends when the client hangs up
        writer.close()

    async def run() -> None:
        silent = await asyncio.start_server(wedged, "127.0.0.1", 0)
        port = silent.sockets[0].getsockname()[1]
        engines = [
            cls(up.url, tokenizer),
            cls(f"http://127.0.0.1:{port}", tokenizer, request_timeout_s=3600.0),
        ]
        pool = EnginePool(engines, health_interval_s=0)
        try:
            # Generous: only ends a hung test (the old code waited request_timeout_s, an hour here).
            await asyncio.wait_for(pool.start(), timeout=150)
            assert accepted.is_set()
            assert [r.healthy for r in pool.replicas] == [True, False]
            await _calls(pool, reply, 4)
        finally:
            await pool.aclose()
            silent.close()

    asyncio.run(run())
