"""EnginePool over fake vLLM replicas: affinity, retries, failover, draining, and a real gateway run."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from tests.fakes.vllm_server import FakeServer, serve_vllm

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.engines.base import GenerationContext, SamplingParams, TokenSample, WeightUpdate, each_sample
from harnessrl.engines.pool import EnginePool
from harnessrl.engines.remote import AbortedByEngine, RemoteEngineError
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.engines.vllm import VLLMEngine
from harnessrl.errors import UpstreamError
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.token_ids import TokenIds
from harnessrl.tokenizer import PolicyTokenizer


@pytest.fixture(scope="module")
def tokenizer() -> PolicyTokenizer:
    return PolicyTokenizer.from_dir(tiny_model_dir(weights=False))


@pytest.fixture(scope="module")
def reply(tokenizer: PolicyTokenizer) -> list[int]:
    return tokenizer.encode("The answer is 42, as computed.<|im_end|>")


@pytest.fixture
def servers(reply: list[int]) -> Iterator[list[FakeServer]]:
    started = [serve_vllm(reply), serve_vllm(reply)]
    yield started
    for server in started:
        server.kill()


def make_pool(
    servers: list[FakeServer], tokenizer: PolicyTokenizer, **kwargs: object
) -> tuple[EnginePool, list]:
    delays: list[float] = []

    async def no_sleep(seconds: float) -> None:
        delays.append(seconds)

    pool = EnginePool(
        [VLLMEngine(s.url, tokenizer) for s in servers], health_interval_s=0, sleep=no_sleep, **kwargs
    )
    return pool, delays


async def generate(pool: EnginePool, rollout: str | None, max_tokens: int = 100) -> list[TokenSample]:
    ctx = GenerationContext(rollout_id=rollout)
    return [
        s async for s in each_sample(pool.generate([7, 8, 9], SamplingParams(max_tokens=max_tokens), ctx))
    ]


def test_affinity_same_rollout_same_replica(servers: list[FakeServer], tokenizer: PolicyTokenizer) -> None:
    pool, _ = make_pool(servers, tokenizer)
    rollouts = [f"rollout-{i}" for i in range(12)]

    async def run() -> None:
        await pool.start()
        try:
            for rollout in rollouts:
                home = pool.preference(rollout)[0]
                before = pool.replicas[home].served
                for _ in range(3):
                    await generate(pool, rollout, max_tokens=2)
                assert pool.replicas[home].served == before + 3
        finally:
            await pool.aclose()

    asyncio.run(run())
    assert all(r.served > 0 for r in pool.replicas)  # the ring spreads rollouts over both


def test_retries_with_backoff_before_first_token(
    servers: list[FakeServer], tokenizer: PolicyTokenizer, reply: list[int]
) -> None:
    pool, delays = make_pool(servers, tokenizer, backoff_s=0.1)
    home = pool.preference("r")[0]
    servers[home].fake.fail_with = [429]
    servers[1 - home].fake.fail_with = [503]

    async def run() -> list[TokenSample]:
        await pool.start()
        try:
            return await generate(pool, "r")
        finally:
            await pool.aclose()

    samples = asyncio.run(run())
    assert [s.token_id for s in samples] == reply
    assert delays == [0.1, 0.2]  # exponential
    assert all(r.healthy for r in pool.replicas)  # overload is not ill health


def test_non_retryable_error_is_raised(servers: list[FakeServer], tokenizer: PolicyTokenizer) -> None:
    pool, delays = make_pool(servers, tokenizer)
    for server in servers:
        server.fake.fail_with = [400]

    async def run() -> None:
        await pool.start()
        try:
            await generate(pool, "r")
        finally:
            await pool.aclose()

    with pytest.raises(RemoteEngineError):
        asyncio.run(run())
    assert delays == []


def test_dead_replica_falls_back_and_is_marked_unhealthy(
    servers: list[FakeServer], tokenizer: PolicyTokenizer, reply: list[int]
) -> None:
    pool, _ = make_pool(servers, tokenizer)
    home = pool.preference("r")[0]

    async def run() -> list[TokenSample]:
        await pool.start()
        try:
            servers[home].kill()
            samples = await generate(pool, "r")
            assert not pool.replicas[home].healthy
            await pool.check_health()
            assert not pool.replicas[home].healthy and pool.replicas[1 - home].healthy
            return samples
        finally:
            await pool.aclose()

    assert [s.token_id for s in asyncio.run(run())] == reply


def test_mid_stream_death_continues_on_another_replica(
    servers: list[FakeServer], tokenizer: PolicyTokenizer, reply: list[int]
) -> None:
    pool, _ = make_pool(servers, tokenizer)
    home = pool.preference("r")[0]
    servers[home].fake.kill_after_tokens = 3

    async def run() -> list[TokenSample]:
        await pool.start()
        try:
            return await generate(pool, "r")
        finally:
            await pool.aclose()

    samples = asyncio.run(run())
    # Exactly the reply, no token twice, logprobs as the model gave them.
    assert [s.token_id for s in samples] == reply
    assert [s.logprob for s in samples] == pytest.approx([-(j + 1) / 100 for j in range(len(reply))])
    # The survivor was asked to continue from prompt + the 3 tokens already streamed.
    assert servers[1 - home].fake.prompts == [[7, 8, 9, *reply[:3]]]


def test_the_prompt_reaches_the_replica_as_given_with_its_kept_json(
    servers: list[FakeServer], tokenizer: PolicyTokenizer, reply: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway's prompt is a ``TokenIds`` whose JSON array was built from the previous call's; the
    pool once copied it into a plain list, so vLLM's engine encoded every long prompt again on every
    call. A continuation after a mid-stream death extends the kept encoding the same way."""
    seen: list[object] = []
    generate_on_replica = VLLMEngine.generate

    def spy(self: VLLMEngine, prompt_ids, params, context=None):  # noqa: ANN001, ANN202
        seen.append(prompt_ids)
        return generate_on_replica(self, prompt_ids, params, context)

    monkeypatch.setattr(VLLMEngine, "generate", spy)
    pool, _ = make_pool(servers, tokenizer)
    home = pool.preference("r")[0]
    servers[home].fake.kill_after_tokens = 3
    prompt = TokenIds([7, 8, 9])
    prompt.json()  # kept, as the gateway's prompt builder leaves it

    async def run() -> list[TokenSample]:
        await pool.start()
        try:
            ctx = GenerationContext(rollout_id="r")
            return [s async for s in each_sample(pool.generate(prompt, SamplingParams(max_tokens=100), ctx))]
        finally:
            await pool.aclose()

    assert [s.token_id for s in asyncio.run(run())] == reply
    first, continued = seen
    assert first is prompt
    assert isinstance(continued, TokenIds) and continued._json is not None  # extended, not rebuilt
    assert continued.json() == orjson.dumps([7, 8, 9, *reply[:3]])
    assert servers[1 - home].fake.prompts == [[7, 8, 9, *reply[:3]]]


def test_a_survivors_transient_failure_does_not_send_the_remaining_tries_to_the_dead_replica(
    servers: list[FakeServer], tokenizer: PolicyTokenizer, reply: list[int]
) -> None:
    """The home replica dies mid-stream and the survivor's first answer is a 500: the call goes on,
    alternating by fewest failures, and the survivor finishes it (a CI run once failed this way)."""
    pool, _ = make_pool(servers, tokenizer)
    home = pool.preference("r")[0]
    servers[home].fake.kill_after_tokens = 3
    servers[1 - home].fake.fail_with = [500]

    async def run() -> list[TokenSample]:
        await pool.start()
        try:
            return await generate(pool, "r")
        finally:
            await pool.aclose()

    samples = asyncio.run(run())
    assert [s.token_id for s in samples] == reply
    # The dead replica got the interrupted call and one retry (refused); the survivor the rest.
    assert [r.served for r in (pool.replicas[home], pool.replicas[1 - home])] == [2, 2]


def test_mid_stream_death_raises_when_resume_is_off(
    servers: list[FakeServer], tokenizer: PolicyTokenizer
) -> None:
    pool, _ = make_pool(servers, tokenizer, resume_mid_stream=False)
    servers[pool.preference("r")[0]].fake.kill_after_tokens = 3

    async def run() -> None:
        await pool.start()
        try:
            await generate(pool, "r")
        finally:
            await pool.aclose()

    with pytest.raises(RemoteEngineError):
        asyncio.run(run())


@pytest.mark.parametrize("mode", ["all_at_once", "rolling"])
def test_update_drains_in_flight_calls(
    servers: list[FakeServer], tokenizer: PolicyTokenizer, mode: str
) -> None:
    pool, _ = make_pool(servers, tokenizer, update_mode=mode)
    for server in servers:
        server.fake.token_delay_s = 0.01
    events: list[str] = []
    streaming = asyncio.Event()

    async def slow_call() -> None:
        ctx = GenerationContext(rollout_id="r")
        async for _ in pool.generate([7, 8, 9], SamplingParams(max_tokens=100), ctx):
            streaming.set()  # a first token came: the generation is in flight on a replica
        events.append("generation done")

    async def run() -> None:
        await pool.start()
        try:
            task = asyncio.create_task(slow_call())
            await asyncio.wait_for(streaming.wait(), 600)
            await pool.update_weights(WeightUpdate(version=7, checkpoint_dir="/ckpt/7"))
            events.append("update done")
            await task
        finally:
            await pool.aclose()

    asyncio.run(run())
    assert events == ["generation done", "update done"]
    assert pool.policy_version == 7
    for server in servers:
        assert [p for p, _ in server.fake.calls] == ["/pause", "/collective_rpc", "/resume"]
    assert not any(r.draining for r in pool.replicas)


def test_replica_that_misses_an_update_stays_out(
    servers: list[FakeServer], tokenizer: PolicyTokenizer
) -> None:
    pool, _ = make_pool(servers, tokenizer)

    async def run() -> None:
        await pool.start()
        try:
            servers[0].kill()
            await pool.update_weights(WeightUpdate(version=2, checkpoint_dir="/ckpt/2"))
            assert pool.replicas[0].pending is not None and pool.replicas[0].draining
            assert pool.policy_version == 2  # only replicas serving the new weights count
            for i in range(6):
                await generate(pool, f"r{i}", max_tokens=2)
            assert pool.replicas[0].served == 0
        finally:
            await pool.aclose()

    asyncio.run(run())


def test_gateway_survives_replica_death_mid_rollout(
    servers: list[FakeServer], tokenizer: PolicyTokenizer, tmp_path: Path
) -> None:
    """A real gateway over a pool of two fake vLLM replicas; an OpenAI-SDK multi-turn conversation.

    The replica serving the rollout dies in the middle of turn 2's answer (3 tokens streamed): the
    pool continues that answer on the other replica, later calls go there too; the harness sees no
    error and every call is recorded exactly once.
    """
    openai = pytest.importorskip("openai")
    pool = EnginePool([VLLMEngine(s.url, tokenizer) for s in servers], health_interval_s=0.2, backoff_s=0.01)
    store = SQLiteStore(tmp_path / "store.db")
    app = create_app(GatewayConfig(admin_key="admin"), store, pool)
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(serve_in_thread(app))
        admin = stack.enter_context(GatewayClient(url, "admin"))
        rollout = admin.create_rollout({"prompt": "failover"})
        client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
        home = pool.preference(rollout["rollout_id"])[0]
        messages: list[dict[str, str]] = [{"role": "system", "content": "You are terse."}]
        for turn in range(6):
            if turn == 2:
                servers[home].fake.kill_after_tokens = 3  # dies mid-answer
            messages.append({"role": "user", "content": f"question {turn}"})
            answer = client.chat.completions.create(model="policy", messages=messages, stream=turn % 2 == 1)
            if turn % 2 == 1:
                text = "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
            else:
                text = answer.choices[0].message.content
            assert text == "The answer is 42, as computed."
            messages.append({"role": "assistant", "content": text})
        calls = admin.list_calls(rollout["rollout_id"])
    store.close()
    assert [c.seq for c in calls] == list(range(6))  # recorded once each, in order
    # Turns 0-2 went home; the rest of turn 2 continued on the other replica. Where later turns go
    # depends on when the health loop re-admits the home replica, so only the lower bounds are fixed.
    assert len(servers[home].fake.prompts) >= 3
    assert len(servers[1 - home].fake.prompts) >= 1
    assert servers[home].fake.killed.is_set()


def test_an_abort_mid_stream_is_raised_not_continued_elsewhere(
    servers: list[FakeServer], tokenizer: PolicyTokenizer
) -> None:
    """vLLM ends in-flight requests with finish_reason "abort" when paused with mode=abort: the
    weights are about to change, so the pool must not continue the answer on another replica (one
    answer would mix two policies); the caller gets a retryable error naming the abort."""
    pool, _ = make_pool(servers, tokenizer)
    home = pool.preference("r")[0]
    servers[home].fake.abort_after_tokens = 3
    seen: list[int] = []

    async def run() -> None:
        await pool.start()
        try:
            ctx = GenerationContext(rollout_id="r")
            async for s in each_sample(pool.generate([7, 8, 9], SamplingParams(max_tokens=100), ctx)):
                seen.append(s.token_id)
        finally:
            await pool.aclose()

    with pytest.raises(AbortedByEngine, match="abort"):
        asyncio.run(run())
    assert len(seen) == 3
    assert servers[1 - home].fake.prompts == []  # not continued
    assert all(r.healthy for r in pool.replicas)  # an abort is not a dead replica


def test_an_abort_before_any_token_reached_the_caller_is_retried_from_the_prompt(
    servers: list[FakeServer], tokenizer: PolicyTokenizer, reply: list[int]
) -> None:
    """Not streaming, the whole (aborted) answer arrives at once and nothing was yielded yet: the pool
    asks again from the prompt and the caller gets one whole, untruncated answer."""
    pool, delays = make_pool(servers, tokenizer)
    home = pool.preference("r")[0]
    servers[home].fake.abort_after_tokens = 2

    async def run() -> list[TokenSample]:
        await pool.start()
        try:
            ctx = GenerationContext(rollout_id="r", stream=False)
            return [
                s async for s in each_sample(pool.generate([7, 8, 9], SamplingParams(max_tokens=100), ctx))
            ]
        finally:
            await pool.aclose()

    samples = asyncio.run(run())
    assert [s.token_id for s in samples] == reply
    assert len(delays) == 1  # backed off once
    prompts = servers[0].fake.prompts + servers[1].fake.prompts
    assert prompts == [[7, 8, 9], [7, 8, 9]]  # from the prompt both times


def test_an_aborted_answer_reaches_neither_the_harness_as_an_answer_nor_the_store(
    servers: list[FakeServer], tokenizer: PolicyTokenizer, tmp_path: Path
) -> None:
    """Bug 2 of issue 16: an answer vLLM aborted was labelled ``length`` and recorded as a normal
    call. Streaming, the harness now gets an error event instead of a short answer and nothing is
    stored; not streaming, the pool asks again and the harness gets the whole answer, stored once."""
    openai = pytest.importorskip("openai")
    pool = EnginePool([VLLMEngine(servers[0].url, tokenizer)], health_interval_s=0, backoff_s=0.01)
    store = SQLiteStore(tmp_path / "store.db")
    app = create_app(GatewayConfig(admin_key="admin"), store, pool)
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(serve_in_thread(app))
        admin = stack.enter_context(GatewayClient(url, "admin"))
        rollout = admin.create_rollout({"prompt": "abort"})
        client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
        messages = [{"role": "user", "content": "hi"}]
        servers[0].fake.abort_after_tokens = 3
        with pytest.raises(openai.APIError, match="abort"):
            for _ in client.chat.completions.create(model="policy", messages=messages, stream=True):
                pass
        assert admin.list_calls(rollout["rollout_id"]) == []
        servers[0].fake.abort_after_tokens = 3
        answer = client.chat.completions.create(model="policy", messages=messages)
        assert answer.choices[0].message.content == "The answer is 42, as computed."
        assert answer.choices[0].finish_reason == "stop"
        calls = admin.list_calls(rollout["rollout_id"])
    store.close()
    assert [c.finish_reason for c in calls] == ["stop"]
    assert len(calls[0].response_token_ids) == len(
        tokenizer.encode("The answer is 42, as computed.<|im_end|>")
    )


def test_a_continuation_must_match_the_version_of_the_replica_that_streamed_not_one_that_failed(
    tokenizer: PolicyTokenizer, reply: list[int]
) -> None:
    """Replicas serve different versions (a rolling update): the first try fails before any token on
    a version-1 replica, a version-2 replica streams 3 tokens and dies. The only survivor serves
    version 1, so continuing there would make one answer of two policies: the call fails instead."""
    servers = [serve_vllm(reply) for _ in range(3)]
    try:
        servers[0].fake.fail_with = [503]
        servers[1].fake.kill_after_tokens = 3
        pool, _ = make_pool(servers, tokenizer)

        async def run() -> list[TokenSample]:
            await pool.start()
            try:
                for replica, version in zip(pool.replicas, (1, 2, 1), strict=True):
                    replica.engine.adopt_policy_version(version)
                assert pool.preference(None) == [0, 1, 2]  # the order the tries take
                return await generate(pool, None)
            finally:
                await pool.aclose()

        with pytest.raises(UpstreamError, match="policy version 2"):
            asyncio.run(run())
        assert servers[2].fake.prompts == []  # never asked to continue version 2's tokens
        # Control: the survivor serves version 2, so the continuation is exact and the answer whole.
        servers = [*servers[:2], servers[2]]
        servers[0].fake.fail_with = [503]
        servers[1] = serve_vllm(reply)
        servers[1].fake.kill_after_tokens = 3
        pool, _ = make_pool(servers, tokenizer)

        async def run_control() -> list[TokenSample]:
            await pool.start()
            try:
                for replica, version in zip(pool.replicas, (1, 2, 2), strict=True):
                    replica.engine.adopt_policy_version(version)
                return await generate(pool, None)
            finally:
                await pool.aclose()

        assert [s.token_id for s in asyncio.run(run_control())] == reply
        assert servers[2].fake.prompts == [[7, 8, 9, *reply[:3]]]
    finally:
        for server in servers:
            server.kill()


def test_a_replica_that_fails_after_the_stop_token_ends_the_answer_there(
    tokenizer: PolicyTokenizer, reply: list[int]
) -> None:
    """The server goes away after streaming the stop token, before its stream's end: the answer is
    whole, so it is the call's; nothing is generated past it on another replica."""
    from tests.engines.test_vllm_transport import Knobs, serve_knobs

    stop = reply[-1]
    knobs = Knobs(tokens=[(t, -0.5) for t in reply], last_event=None, done="")
    cut = serve_knobs(knobs)
    other = serve_vllm(reply)
    try:
        pool, _ = make_pool([cut, other], tokenizer)

        async def run() -> list[TokenSample]:
            await pool.start()
            try:
                ctx = GenerationContext(rollout_id=None)
                params = SamplingParams(max_tokens=100, stop_token_ids=(stop,))
                return [s async for s in each_sample(pool.generate([7, 8, 9], params, ctx))]
            finally:
                await pool.aclose()

        assert [s.token_id for s in asyncio.run(run())] == reply
        assert other.fake.prompts == []
    finally:
        cut.kill()
        other.kill()


def serve_gated_vllm() -> tuple[FakeServer, dict[str, Any]]:
    """A vLLM server whose weight reloads can be held: ``state["held"]`` names a checkpoint folder
    whose ``/collective_rpc`` waits until ``state["gate"]`` is set; ``state["fail_pause"]`` answers
    that many ``/pause`` calls 503 (the server is down for an update). ``state["reloads"]`` lists the
    folders reloaded, in the order they finished: the last is what the server serves."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route
    from tests.fakes.vllm_server import FakeModel

    state: dict[str, Any] = {
        "held": None,
        "gate": threading.Event(),
        "fail_pause": 0,
        "arrived": [],
        "reloads": [],
    }

    async def models(request: Request) -> Response:
        return JSONResponse({"data": [{"id": "m", "max_model_len": 4096}]})

    async def ok(request: Request) -> Response:
        return JSONResponse({})

    async def pause(request: Request) -> Response:
        if state["fail_pause"]:
            state["fail_pause"] -= 1
            return JSONResponse({"error": "down"}, 503)
        return JSONResponse({})

    async def rpc(request: Request) -> Response:
        folder = (await request.json())["kwargs"]["weights_path"]
        state["arrived"].append(folder)
        if folder == state["held"]:
            await asyncio.to_thread(state["gate"].wait, 600)
        state["reloads"].append(folder)
        return JSONResponse({})

    app = Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/health", ok),
            Route("/pause", pause, methods=["POST"]),
            Route("/resume", ok, methods=["POST"]),
            Route("/collective_rpc", rpc, methods=["POST"]),
        ]
    )
    return FakeServer(app, FakeModel([0])).start(), state


async def _until(condition: Any, what: str) -> None:
    """Wait for ``condition()`` (a generous bound only ends a hung test)."""
    for _ in range(60_000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_missed_update_applied_late_never_overtakes_a_newer_one(tokenizer: PolicyTokenizer) -> None:
    """A replica missed update 2 (down); the health loop finds it up and starts giving it 2, and
    update 3 comes while that reload is still running. Update 3 must be the last the replica
    installs: run beside it, the older reload finishing last put the replica back into rotation
    serving (and labelled with) version 2 while the others served 3."""
    gated, state = serve_gated_vllm()
    other = serve_vllm([5])
    try:
        state["fail_pause"] = 1  # down for update 2
        pool = EnginePool(
            [VLLMEngine(s.url, tokenizer, pause_timeout_s=60) for s in (gated, other)],
            health_interval_s=0.01,
        )

        async def run() -> None:
            await pool.start()
            try:
                await pool.update_weights(WeightUpdate(version=2, checkpoint_dir="/ckpt/2"))
                assert pool.replicas[0].pending is not None  # missed it
                state["held"] = "/ckpt/2"  # the health loop's late reload of 2 will hang
                await _until(lambda: "/ckpt/2" in state["arrived"], "the late reload of update 2")
                update3 = asyncio.create_task(
                    pool.update_weights(WeightUpdate(version=3, checkpoint_dir="/ckpt/3"))
                )
                # Update 3 either reached the server beside the late reload (the bug) or waits for it.
                await _until(
                    lambda: "/ckpt/3" in state["arrived"] or bool(pool._update_lock._waiters),
                    "update 3 to reach the server or wait its turn",
                )
                state["gate"].set()
                await asyncio.wait_for(update3, 600)
                await _until(lambda: pool.replicas[0].pending is None, "the replica back in rotation")
            finally:
                await pool.aclose()

        asyncio.run(run())
        assert state["reloads"][-1] == "/ckpt/3"  # what the replica serves
        assert [r.engine.policy_version for r in pool.replicas] == [3, 3]
        assert pool.policy_version == 3 and not pool.replicas[0].draining
    finally:
        state["gate"].set()
        gated.kill()
        other.kill()


def test_a_replica_that_fails_once_the_answer_filled_the_context_ends_the_answer_there(
    tokenizer: PolicyTokenizer,
) -> None:
    """The server goes away after the last token the context holds, before its stream's end: the
    answer is whole ("length"). Continuing it elsewhere would send a prompt that fills the context:
    a ContextLengthExceeded (the harness's request blamed, a 400) mid-stream instead of the answer."""
    from tests.engines.test_vllm_transport import Knobs, serve_knobs

    knobs = Knobs(tokens=[(5 + i, -0.5) for i in range(7)], last_event=None, done="")
    cut = serve_knobs(knobs)
    other = serve_vllm([9, 9, 9])
    try:
        pool = EnginePool(
            [VLLMEngine(s.url, tokenizer, context_length=10) for s in (cut, other)], health_interval_s=0
        )

        async def run() -> list[TokenSample]:
            await pool.start()
            try:
                params = SamplingParams(max_tokens=100)  # the context (10 - 3), not this, is the limit
                return [s async for s in each_sample(pool.generate([1, 2, 3], params, GenerationContext()))]
            finally:
                await pool.aclose()

        assert [s.token_id for s in asyncio.run(run())] == [t for t, _ in knobs.tokens]
        assert other.fake.prompts == []
    finally:
        cut.kill()
        other.kill()
