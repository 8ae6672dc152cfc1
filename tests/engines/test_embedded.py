"""The embedded engine: logprobs equal a plain forward pass, batching is invisible, control works."""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from harnessrl.config import EngineConfig  # noqa: E402
from harnessrl.engines.base import Engine, SamplingParams, TokenSample, WeightUpdate, each_sample  # noqa: E402
from harnessrl.engines.embedded import EmbeddedEngine  # noqa: E402
from harnessrl.engines.factory import create_engine  # noqa: E402
from harnessrl.errors import ContextLengthExceeded, InvalidWeightUpdate, UpstreamError  # noqa: E402
from harnessrl.trainer import allocator  # noqa: E402


def _start(engine: EmbeddedEngine) -> EmbeddedEngine:
    asyncio.run(engine.start())
    return engine


@pytest.fixture(scope="module")
def tiny(tiny_dir: Path) -> Iterator[EmbeddedEngine]:
    engine = _start(EmbeddedEngine(tiny_dir, max_batch_size=16, seed=0))
    yield engine
    asyncio.run(engine.aclose())


def _prompts(engine: EmbeddedEngine, n: int) -> list[list[int]]:
    tok = engine.tokenizer
    return [
        tok.encode_chat([{"role": "user", "content": f"Request {i}: write {'x' * i} please."}])
        for i in range(n)
    ]


async def _generate(engine: Engine, prompt: list[int], params: SamplingParams) -> list[TokenSample]:
    return [s async for s in each_sample(engine.generate(prompt, params))]


def _reference_logprobs(
    model, prompt: list[int], samples: list[TokenSample], temperature: float
) -> torch.Tensor:
    ids = torch.tensor([prompt + [s.token_id for s in samples]])
    with torch.inference_mode():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return logprobs.gather(-1, ids[0, len(prompt) :, None])[:, 0]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_a_fresh_forward_pass(
    tiny: EmbeddedEngine, tiny_dir: Path, temperature: float
) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_dir)).eval()
    prompts = _prompts(tiny, 4)
    params = SamplingParams(max_tokens=24, temperature=temperature, seed=3)

    async def run():
        return await asyncio.gather(*[_generate(tiny, p, params) for p in prompts])

    for prompt, samples in zip(prompts, asyncio.run(run()), strict=True):
        assert len(samples) == 24
        got = torch.tensor([s.logprob for s in samples])
        torch.testing.assert_close(
            got, _reference_logprobs(model, prompt, samples, temperature), atol=1e-4, rtol=0
        )


def test_smollm2_logprobs_match_a_fresh_forward_pass(smollm2_dir: Path) -> None:
    engine = _start(EmbeddedEngine(smollm2_dir, max_batch_size=4))
    try:
        prompts = _prompts(engine, 3)
        params = SamplingParams(max_tokens=12, temperature=1.0, seed=0)

        async def run():
            return await asyncio.gather(*[_generate(engine, p, params) for p in prompts])

        outputs = asyncio.run(run())
        for prompt, samples in zip(prompts, outputs, strict=True):
            got = torch.tensor([s.logprob for s in samples])
            want = _reference_logprobs(engine.model, prompt, samples, 1.0)
            torch.testing.assert_close(got, want, atol=2e-3, rtol=0)
    finally:
        asyncio.run(engine.aclose())


def test_concurrent_greedy_equals_sequential_and_is_batched(tiny: EmbeddedEngine) -> None:
    prompts = _prompts(tiny, 8)
    params = SamplingParams(max_tokens=48, temperature=0.0)

    async def sequential():
        return [await _generate(tiny, p, params) for p in prompts]

    async def concurrent():
        return await asyncio.gather(*[_generate(tiny, p, params) for p in prompts])

    def engine_steps() -> int:
        return asyncio.run(tiny.health())["steps"]

    s0 = engine_steps()
    seq = asyncio.run(sequential())
    s1 = engine_steps()
    conc = asyncio.run(concurrent())
    s2 = engine_steps()
    assert [[s.token_id for s in out] for out in conc] == [[s.token_id for s in out] for out in seq]
    # Batched: the 8 requests share forward passes (one step per token for all of them, not per
    # request), counted by the engine, not timed (a wall-clock bound failed under parallel tests).
    assert s2 - s1 < 0.25 * (s1 - s0), (s1 - s0, s2 - s1)


def test_sampling_is_reproducible_per_seed_whatever_the_batch(tiny: EmbeddedEngine) -> None:
    prompt, other = _prompts(tiny, 2)
    params = SamplingParams(max_tokens=20, temperature=1.0, seed=42)
    alone = asyncio.run(_generate(tiny, prompt, params))

    async def together():
        noise = SamplingParams(max_tokens=30, temperature=1.0)
        return await asyncio.gather(_generate(tiny, prompt, params), _generate(tiny, other, noise))

    assert [s.token_id for s in asyncio.run(together())[0]] == [s.token_id for s in alone]


def test_a_vanishing_temperature_samples_at_vllms_floor(tiny: EmbeddedEngine) -> None:
    """A client may send any temperature in [0, 2]: 1e-39 overflowed the tempered logits, sampling the
    vocabulary's last token with a NaN logprob. A positive temperature below 0.01 samples at 0.01, as
    vLLM does (its _MAX_TEMP), with that distribution's logprobs."""
    prompt = _prompts(tiny, 1)[0]
    floor = asyncio.run(_generate(tiny, prompt, SamplingParams(max_tokens=8, temperature=0.01, seed=5)))
    for temperature in (1e-39, 1e-6):
        got = asyncio.run(
            _generate(tiny, prompt, SamplingParams(max_tokens=8, temperature=temperature, seed=5))
        )
        assert got == floor
        assert all(math.isfinite(s.logprob) for s in got)


def test_max_tokens_and_stop_tokens(tiny: EmbeddedEngine) -> None:
    prompt = _prompts(tiny, 1)[0]
    full = asyncio.run(_generate(tiny, prompt, SamplingParams(max_tokens=30, temperature=0.0)))
    assert len(full) == 30
    ids = [s.token_id for s in full]
    stop = ids[10]
    cut = asyncio.run(
        _generate(tiny, prompt, SamplingParams(max_tokens=30, temperature=0.0, stop_token_ids=(stop,)))
    )
    assert [s.token_id for s in cut] == ids[: ids.index(stop) + 1]
    assert len(asyncio.run(_generate(tiny, prompt, SamplingParams(max_tokens=1, temperature=0.0)))) == 1


def test_cancellation_frees_the_row(tiny: EmbeddedEngine) -> None:
    prompts = _prompts(tiny, 2)

    async def run():
        stream = tiny.generate(prompts[0], SamplingParams(max_tokens=3000, temperature=1.0))
        survivor = asyncio.create_task(_generate(tiny, prompts[1], SamplingParams(max_tokens=40)))
        got = [await anext(stream) for _ in range(3)]
        await stream.aclose()
        done = await survivor
        for _ in range(100):
            if (await tiny.health())["active"] == 0:
                break
            await asyncio.sleep(0.01)
        return got, done, await tiny.health()

    got, survivor, health = asyncio.run(run())
    assert len(got) == 3 and len(survivor) == 40
    assert health["active"] == 0 and health["waiting"] == 0


def _greedy_ids(engine: EmbeddedEngine, prompt: list[int]) -> list[int]:
    samples = asyncio.run(_generate(engine, prompt, SamplingParams(max_tokens=16, temperature=0.0)))
    return [s.token_id for s in samples]


def _serves_its_module(engine: EmbeddedEngine, prompt: list[int]) -> tuple[list[TokenSample], torch.Tensor]:
    """Sampled logprobs equal a forward pass of the engine's transformers module: every weight it
    samples with is the module's (a stale fused QKV / gate-up copy would break this). Returns the
    samples and the module's logprobs of them."""
    sampled = asyncio.run(_generate(engine, prompt, SamplingParams(max_tokens=8, temperature=1.0, seed=0)))
    want = _reference_logprobs(engine.model, prompt, sampled, 1.0)
    torch.testing.assert_close(torch.tensor([s.logprob for s in sampled]), want, atol=1e-4, rtol=0)
    return sampled, want


def test_update_weights_changes_outputs_and_version(tiny_dir: Path) -> None:
    engine = _start(EmbeddedEngine(tiny_dir, max_batch_size=4))
    try:
        prompt = _prompts(engine, 1)[0]
        before = _greedy_ids(engine, prompt)
        original = {k: v.clone() for k, v in engine.model.state_dict().items()}
        gen = torch.Generator().manual_seed(1)
        perturbed = {k: v + 0.5 * torch.randn(v.shape, generator=gen) for k, v in original.items()}
        asyncio.run(engine.update_weights(WeightUpdate(version=1, state_dict=perturbed)))
        assert engine.policy_version == 1
        _serves_its_module(engine, prompt)  # every weight was replaced
        assert _greedy_ids(engine, prompt) != before
        asyncio.run(engine.update_weights(WeightUpdate(version=2, state_dict=original)))
        assert _greedy_ids(engine, prompt) == before
        assert engine.policy_version == 2
    finally:
        asyncio.run(engine.aclose())


def test_released_weights_refuse_generation_until_a_full_update_refills_them(tiny_dir: Path) -> None:
    engine = _start(EmbeddedEngine(tiny_dir, max_batch_size=4))
    try:
        prompt = _prompts(engine, 1)[0]
        before = _greedy_ids(engine, prompt)
        original = {k: v.clone() for k, v in engine.model.state_dict().items()}

        # Refused while a generation is in flight: its rows still read the weights. The longest answer
        # the context allows (~4,000 decode steps) is still decoding when the release is asked.
        longest = engine.context_length - len(prompt) - 1

        async def release_mid_generation() -> bool:
            stream = engine.generate(prompt, SamplingParams(max_tokens=longest, temperature=1.0, seed=0))
            await anext(stream)
            try:
                return await engine.release_weights()
            finally:
                await stream.aclose()

        assert asyncio.run(release_mid_generation()) is False
        assert all(p.untyped_storage().nbytes() > 0 for p in engine.model.parameters())

        assert asyncio.run(engine.release_weights()) is True
        assert all(p.untyped_storage().nbytes() == 0 for p in engine.model.parameters())
        assert asyncio.run(engine.health())["weights_released"] is True
        with pytest.raises(UpstreamError, match="released"):
            _greedy_ids(engine, prompt)
        # An update that leaves a weight out would serve uninitialized memory: refused, still released.
        partial = {k: v for k, v in original.items() if "layers.0." not in k}
        with pytest.raises(InvalidWeightUpdate, match="leaves out"):
            asyncio.run(engine.update_weights(WeightUpdate(version=1, state_dict=partial)))
        assert all(p.untyped_storage().nbytes() == 0 for p in engine.model.parameters())

        asyncio.run(engine.update_weights(WeightUpdate(version=1, state_dict=original)))
        assert engine.policy_version == 1
        assert asyncio.run(engine.health())["weights_released"] is False
        assert _greedy_ids(engine, prompt) == before
        # every weight, fused QKV / gate-up views included, holds the update again
        sampled, want = _serves_its_module(engine, prompt)
        fresh = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_dir)).eval()
        torch.testing.assert_close(want, _reference_logprobs(fresh, prompt, sampled, 1.0), atol=1e-5, rtol=0)
    finally:
        asyncio.run(engine.aclose())


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(allocator._libc() is None, reason="glibc's malloc_trim gives freed heap pages back")
def test_releasing_the_weights_gives_their_memory_back(smollm2_dir: Path) -> None:
    engine = _start(EmbeddedEngine(smollm2_dir, max_batch_size=4))
    try:
        weights = sum(p.numel() * p.element_size() for p in engine.model.parameters())  # 0.54 GB
        allocator.release()
        held = _rss_bytes()
        assert asyncio.run(engine.release_weights())
        allocator.release()
        freed = held - _rss_bytes()
        assert freed > 0.9 * weights, (freed, weights)
        state = {k: torch.zeros_like(v) for k, v in engine.model.state_dict().items()}
        asyncio.run(engine.update_weights(WeightUpdate(version=1, state_dict=state)))
        assert _rss_bytes() - (held - freed) > 0.9 * weights  # the control: refilled, it is held again
    finally:
        asyncio.run(engine.aclose())


def test_context_length(tiny_dir: Path) -> None:
    engine = _start(EmbeddedEngine(tiny_dir, max_batch_size=2, context_length=40, prefill_chunk=16))
    try:
        with pytest.raises(ContextLengthExceeded):
            asyncio.run(_generate(engine, list(range(5, 45)), SamplingParams(max_tokens=4)))
        # A 30-token prompt (prefilled in chunks of 16) can grow to 40 tokens: at most 10 new ones.
        out = asyncio.run(_generate(engine, list(range(5, 35)), SamplingParams(max_tokens=100)))
        assert len(out) == 10
    finally:
        asyncio.run(engine.aclose())


def test_factory_builds_an_embedded_engine_for_tiny() -> None:
    engine = create_engine(EngineConfig(model="tiny", max_batch_size=2))
    assert isinstance(engine, EmbeddedEngine) and isinstance(engine, Engine)
    assert engine.tokenizer.eos_token == "<|im_end|>"


def test_chunked_prefill_while_other_rows_finish(tiny_dir: Path) -> None:
    """A long prompt prefilled in chunks keeps its cache while finished rows are compacted around it."""
    engine = _start(EmbeddedEngine(tiny_dir, max_batch_size=8, prefill_chunk=8))
    try:
        tok = engine.tokenizer
        long_prompt = tok.encode_chat([{"role": "user", "content": "a fairly long request " * 12}])
        assert len(long_prompt) > 40
        short = _prompts(engine, 5)
        greedy = SamplingParams(max_tokens=20, temperature=0.0)
        alone = asyncio.run(_generate(engine, long_prompt, greedy))

        async def mixed():
            shorts = [
                _generate(engine, p, SamplingParams(max_tokens=1 + i, temperature=0.0))
                for i, p in enumerate(short)
            ]
            results = await asyncio.gather(*shorts, _generate(engine, long_prompt, greedy))
            return results[-1]

        assert [s.token_id for s in asyncio.run(mixed())] == [s.token_id for s in alone]
    finally:
        asyncio.run(engine.aclose())


def _shared_prefix_prompts(engine: EmbeddedEngine) -> list[list[int]]:
    """A long system prompt shared by all, some prompts repeated (an RL group), some not."""
    system = {"role": "system", "content": "You are a careful assistant with tools. " * 6}
    # The first differs from the group after it, so the best source row is not simply row 0.
    questions = ["Count to 4.", "What is 2 + 3?", "What is 2 + 3?", "Name a colour.", "What is 2 + 3?"]
    prompts = [engine.tokenizer.encode_chat([system, {"role": "user", "content": q}]) for q in questions]
    assert len(prompts[0]) > 40
    return prompts


@pytest.mark.parametrize("prefill_chunk", [512, 16])
def test_shared_prompt_prefixes_are_copied_not_recomputed(tiny_dir: Path, prefill_chunk: int) -> None:
    """Requests start from a decoding row's cached prefix; outputs and logprobs are unchanged."""
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_dir)).eval()
    sharing = _start(EmbeddedEngine(tiny_dir, max_batch_size=8, prefill_chunk=prefill_chunk))
    plain = _start(
        EmbeddedEngine(tiny_dir, max_batch_size=8, prefill_chunk=prefill_chunk, prefix_sharing=False)
    )
    try:
        prompts = _shared_prefix_prompts(sharing)

        async def run(engine: EmbeddedEngine, params: list[SamplingParams]):
            return await asyncio.gather(
                *[_generate(engine, p, s) for p, s in zip(prompts, params, strict=True)]
            )

        # Different lengths, so rows retire (and the cache compacts) while others are admitted.
        sampled = [SamplingParams(max_tokens=6 + 3 * i, temperature=1.0, seed=i) for i in range(5)]
        for prompt, samples in zip(prompts, asyncio.run(run(sharing, sampled)), strict=True):
            got = torch.tensor([s.logprob for s in samples])
            torch.testing.assert_close(
                got, _reference_logprobs(model, prompt, samples, 1.0), atol=1e-4, rtol=0
            )
        stats = asyncio.run(sharing.health())
        assert stats["prefix_reused_tokens"] >= 3 * 40  # at least the system prompt, three times
        assert stats["prefill_tokens"] + stats["prefix_reused_tokens"] == sum(map(len, prompts))

        greedy = [SamplingParams(max_tokens=12, temperature=0.0)] * 5
        with_sharing = [[s.token_id for s in out] for out in asyncio.run(run(sharing, greedy))]
        without = [[s.token_id for s in out] for out in asyncio.run(run(plain, greedy))]
        assert with_sharing == without
        assert asyncio.run(plain.health())["prefix_reused_tokens"] == 0
    finally:
        asyncio.run(sharing.aclose())
        asyncio.run(plain.aclose())


@pytest.mark.parametrize("flaw", ["unknown name", "wrong shape", "numpy array", "meta tensor"])
def test_a_refused_weight_update_changes_no_weight(tiny_dir: Path, flaw: str) -> None:
    # An update with a weight the model does not have (or of another shape, or one that is not a
    # tensor with data, which load_state_dict reports only after copying all the others) is refused
    # before any weight is copied: otherwise the engine would go on serving some of the new weights
    # labelled with the old version.
    engine = _start(EmbeddedEngine(tiny_dir, max_batch_size=4))
    try:
        original = {k: v.clone() for k, v in engine.model.state_dict().items()}
        update = {k: torch.full_like(v, 0.5) for k, v in original.items()}
        name = sorted(update)[-1]  # copied last or not: either way nothing may be copied
        if flaw == "unknown name":
            update["lm_head.bias"] = torch.zeros(3)
        elif flaw == "wrong shape":
            update[name] = torch.zeros(3)
        elif flaw == "numpy array":  # the right shape, but not a tensor
            update[name] = update[name].numpy()
        else:
            update[name] = torch.empty(update[name].shape, device="meta")
        says = {"unknown name": "unexpected", "wrong shape": "shape"}.get(flaw, "not torch tensors")
        with pytest.raises(InvalidWeightUpdate, match=says):
            asyncio.run(engine.update_weights(WeightUpdate(version=1, state_dict=update)))
        assert engine.policy_version == 0
        for name, value in engine.model.state_dict().items():
            assert torch.equal(value, original[name]), name
        # Control: the same update without the flaw is applied whole.
        whole = {k: torch.full_like(v, 0.5) for k, v in original.items()}
        asyncio.run(engine.update_weights(WeightUpdate(version=1, state_dict=whole)))
        assert engine.policy_version == 1
        assert all(torch.equal(v, whole[k]) for k, v in engine.model.state_dict().items())
    finally:
        asyncio.run(engine.aclose())


def test_a_weight_update_without_weights_is_refused_not_a_relabelling(tiny_dir: Path, tmp_path: Path) -> None:
    # A checkpoint_dir that does not exist (or holds no *.safetensors), or an empty state dict, would
    # change no weight but label the old ones with the new version: refused.
    engine = _start(EmbeddedEngine(tiny_dir, max_batch_size=4))
    try:
        for update in (
            WeightUpdate(version=1, checkpoint_dir=str(tmp_path / "missing")),
            WeightUpdate(version=1, checkpoint_dir=str(tmp_path)),
            WeightUpdate(version=1, state_dict={}),
        ):
            with pytest.raises(InvalidWeightUpdate, match="holds no weights"):
                asyncio.run(engine.update_weights(update))
            assert engine.policy_version == 0
        # Control: a folder with the weights is applied.
        from safetensors.torch import save_file

        save_file(
            {k: v.contiguous() for k, v in engine.model.state_dict().items() if "layers.0." in k},
            str(tmp_path / "w.safetensors"),
        )
        asyncio.run(engine.update_weights(WeightUpdate(version=1, checkpoint_dir=str(tmp_path))))
        assert engine.policy_version == 1
    finally:
        asyncio.run(engine.aclose())
