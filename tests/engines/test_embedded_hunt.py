"""The embedded engine under the conditions a bug hunt found wrong: the engine thread ending (shut
down or failed) with callers on several event loops, sampling rows whose neighbours cut the nucleus,
models with a sliding attention window, and a GPU device."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from harnessrl.engines.base import SamplingParams, collect_samples  # noqa: E402
from harnessrl.engines.decoder import BatchedDecoder  # noqa: E402
from harnessrl.engines.embedded import EmbeddedEngine  # noqa: E402
from harnessrl.engines.sampling import sample_tokens  # noqa: E402
from harnessrl.errors import UpstreamError  # noqa: E402

#: Only ends a hung test; every wait below is for a state.
HUNG_S = 30.0


def _wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + HUNG_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def test_a_generate_that_arrives_as_the_engine_shuts_down_gets_an_error_not_a_hang(tiny_dir: Path) -> None:
    """aclose() stops the engine thread and then waits for it in a worker thread; a request the
    gateway hands over meanwhile passed the "not started" check and was queued behind the thread's
    last look at the queue: it waited forever."""
    engine = EmbeddedEngine(tiny_dir, max_batch_size=2)
    asyncio.run(engine.start())
    thread = engine._thread
    assert thread is not None

    async def run() -> BaseException | list[int]:
        closing = asyncio.create_task(engine.aclose())
        await asyncio.sleep(0)  # aclose has told the thread to stop and awaits its join
        # Without yielding to the loop (so aclose cannot finish), wait for the thread to end.
        _wait_until(lambda: not thread.is_alive(), "the engine thread to end")
        stream = engine.generate(list(range(5, 30)), SamplingParams(max_tokens=4))
        try:
            return (await asyncio.wait_for(collect_samples(stream), HUNG_S))[0]
        except (UpstreamError, TimeoutError) as exc:
            return exc
        finally:
            await closing

    outcome = asyncio.run(run())
    assert isinstance(outcome, UpstreamError), outcome
    assert "shut down" in str(outcome)

    # Control: a started engine serves the same request.
    asyncio.run(engine.start())
    try:
        ids, _ = asyncio.run(
            collect_samples(engine.generate(list(range(5, 30)), SamplingParams(max_tokens=4)))
        )
        assert len(ids) == 4
    finally:
        asyncio.run(engine.aclose())


def test_an_engine_failure_reaches_every_caller_even_after_one_whose_loop_closed(tiny_dir: Path) -> None:
    """A step that raises ends the engine thread, which hands the error to every request it holds.
    A request whose event loop had closed (its caller gone, its row not yet retired) made that
    hand-over raise, and every request after it waited forever."""
    engine = EmbeddedEngine(tiny_dir, max_batch_size=4)
    asyncio.run(engine.start())
    assert engine._decoder is not None
    decode = engine._decoder.decode
    trap, inside, go = threading.Event(), threading.Event(), threading.Event()

    def failing_decode(*args, **kwargs):
        if trap.is_set():
            inside.set()
            go.wait(HUNG_S)
            raise RuntimeError("a step failed")
        return decode(*args, **kwargs)

    engine._decoder.decode = failing_decode  # type: ignore[method-assign]
    other_loop = asyncio.new_event_loop()
    runner = threading.Thread(target=other_loop.run_forever, daemon=True)
    runner.start()
    survivor_started = threading.Event()

    async def survivor() -> list[int]:  # on its own, still open, loop; decodes in the row after
        stream = engine.generate(list(range(7, 30)), SamplingParams(max_tokens=3000))
        first = await anext(stream)
        survivor_started.set()
        return first.token_ids + (await collect_samples(stream))[0]

    async def gone():  # its loop closes (asyncio.run returns) while its row is decoding
        stream = engine.generate(list(range(5, 40)), SamplingParams(max_tokens=3000))
        await anext(stream)
        future = asyncio.run_coroutine_threadsafe(survivor(), other_loop)
        await asyncio.to_thread(survivor_started.wait, HUNG_S)
        trap.set()
        await asyncio.to_thread(inside.wait, HUNG_S)  # the step that will fail holds both rows
        await stream.aclose()
        return future

    try:
        future = asyncio.run(gone())
        go.set()
        with pytest.raises(UpstreamError, match="a step failed"):
            future.result(HUNG_S)  # concurrent.futures.TimeoutError on the old code
        with pytest.raises(UpstreamError, match="a step failed"):
            asyncio.run(collect_samples(engine.generate(list(range(5, 30)), SamplingParams(max_tokens=2))))
    finally:
        go.set()
        other_loop.call_soon_threadsafe(other_loop.stop)
        runner.join(HUNG_S)
        other_loop.close()
        asyncio.run(engine.aclose())


def test_a_top_p_neighbour_does_not_change_a_seeded_full_distribution_answer(tiny_dir: Path) -> None:
    """A request sampling the whole distribution (top_p = 1) looked its token up in vocabulary order
    alone, but in probability order whenever another row of the batch had top_p < 1: the same seed
    gave another answer depending on who else was being served."""
    engine = EmbeddedEngine(tiny_dir, max_batch_size=4)
    asyncio.run(engine.start())
    try:
        prompt, other = list(range(5, 40)), list(range(100, 130))
        seeded = SamplingParams(max_tokens=24, temperature=1.0, seed=7)

        def beside(neighbour_top_p: float) -> list[int]:
            async def run():
                neighbour = SamplingParams(max_tokens=40, temperature=1.0, top_p=neighbour_top_p, seed=1)
                answers = await asyncio.gather(
                    collect_samples(engine.generate(prompt, seeded)),
                    collect_samples(engine.generate(other, neighbour)),
                )
                return answers[0][0]

            return asyncio.run(run())

        alone = asyncio.run(collect_samples(engine.generate(prompt, seeded)))[0]
        assert beside(1.0) == alone  # control: a neighbour with the same setting
        assert beside(0.5) == alone
    finally:
        asyncio.run(engine.aclose())


def test_top_p_zero_samples_the_most_likely_token() -> None:
    """top_p = 0 cut the whole nucleus, the most likely token included: the lookup fell off the end
    and picked the least likely token, with a logprob of +inf. It keeps the most likely one, as a
    tiny top_p does."""
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.05, 0.25], [0.4, 0.1, 0.2, 0.3]]))
    for top_p in (0.0, 1e-6):
        tokens, logprobs = sample_tokens(
            logits, torch.ones(2), torch.full((2,), top_p), torch.tensor([0.3, 0.9])
        )
        assert tokens.tolist() == [1, 0], top_p
        assert logprobs.tolist() == [0.0, 0.0], top_p  # all of the (one-token) nucleus


def _sliding_model(model_type: str, **window: object):
    config = transformers.AutoConfig.for_model(
        model_type,
        vocab_size=200,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        **window,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


@pytest.mark.parametrize(
    ("model_type", "window"),
    [
        ("mistral", {"sliding_window": 8}),  # every layer
        ("qwen2", {"sliding_window": 8, "use_sliding_window": True, "max_window_layers": 1}),  # layer 1
        ("llama", {}),  # control: no window
    ],
)
def test_sliding_window_layers_see_only_their_window(model_type: str, window: dict) -> None:
    """transformers attends over the last `sliding_window` positions in a sliding-window layer; the
    decoder attended over every position, so past the window its logits (and the logprobs recorded
    for training) were not those of the trainer's forward pass."""
    model = _sliding_model(model_type, **window)
    if model_type == "qwen2":
        assert model.config.layer_types == ["full_attention", "sliding_attention"]
    decoder = BatchedDecoder(model, max_rows=2, context_length=256)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 200, (n,), generator=generator).tolist() for n in (30, 11)]
    with torch.inference_mode():
        got: list[list[torch.Tensor]] = [[], []]
        for row, prompt in enumerate(prompts):  # chunked prefill: later chunks start past the window
            for start in range(0, len(prompt), 7):
                last = decoder.prefill(row, prompt[start : start + 7], start)
            got[row].append(last)
        sequences = [list(p) for p in prompts]
        for _ in range(12):  # both rows decode together, at their own positions
            ids = torch.tensor([int(got[r][-1].argmax()) for r in range(2)])
            positions = torch.tensor([len(s) for s in sequences])
            for r in range(2):
                sequences[r].append(int(ids[r]))
            logits = decoder.decode(ids, positions)
            for r in range(2):
                got[r].append(logits[r])
        for r, sequence in enumerate(sequences):
            want = model(torch.tensor([sequence])).logits[0, len(prompts[r]) - 1 :].float()
            torch.testing.assert_close(torch.stack(got[r]), want, atol=1e-4, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_engine_serves_on_a_gpu(tiny_dir: Path) -> None:
    """With device = "cuda" the sampler divided CUDA logits by CPU temperatures and the decoder
    embedded CPU token IDs with CUDA weights: the first sample ended the engine thread."""
    engine = EmbeddedEngine(tiny_dir, device="cuda", max_batch_size=4)
    asyncio.run(engine.start())
    try:
        prompts = [list(range(5, 40)), list(range(5, 30)) + [7, 8]]  # the second shares a prefix
        params = [
            SamplingParams(max_tokens=12, temperature=1.0, seed=3),
            SamplingParams(max_tokens=12, temperature=0.7, top_p=0.9, seed=4),
        ]

        async def run():
            return await asyncio.gather(
                *[collect_samples(engine.generate(p, s)) for p, s in zip(prompts, params, strict=True)]
            )

        model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_dir)).eval()
        for prompt, (ids, logprobs) in zip(prompts, asyncio.run(run()), strict=True):
            assert len(ids) == 12
            with torch.inference_mode():
                logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
            want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
            if prompt is prompts[0]:  # T = 1, top_p = 1: the full softmax
                torch.testing.assert_close(torch.tensor(logprobs), want, atol=1e-3, rtol=0)
            assert all(lp <= 1e-6 for lp in logprobs)
    finally:
        asyncio.run(engine.aclose())


def test_requests_cancelled_while_waiting_leave_the_queue(tiny_dir: Path) -> None:
    """While every row is busy, a harness can send requests and hang up at once, over and over: each
    stayed queued (its prompt held) until a row freed, so the queue grew without bound."""
    engine = EmbeddedEngine(tiny_dir, max_batch_size=2)
    asyncio.run(engine.start())
    prompt = list(range(5, 40))
    try:

        async def run() -> tuple[int, list[int]]:
            # The engine thread takes no step meanwhile: nothing leaves the queue by being admitted.
            with engine._step_lock:
                live = asyncio.ensure_future(
                    collect_samples(engine.generate(prompt, SamplingParams(max_tokens=3)))
                )
                for i in range(200):
                    stream = engine.generate([300 + i] * 500, SamplingParams(max_tokens=5))
                    first = asyncio.ensure_future(anext(stream))
                    await asyncio.sleep(0)  # queued
                    first.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await first
                waiting = (await engine.health())["waiting"]
            return waiting, (await asyncio.wait_for(live, HUNG_S))[0]

        waiting, served = asyncio.run(run())
        assert waiting <= 2, waiting  # the live request and at most one abandoned one (200 before)
        assert len(served) == 3  # control: the request still waiting is served
        assert asyncio.run(engine.health())["waiting"] == 0
    finally:
        asyncio.run(engine.aclose())
