"""``BatchedDecoder``'s KV cache grows by a quarter of its length (rows by doubling), keeps what it
holds, and decodes after growing as a cache sized up front does."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from harnessrl.engines.decoder import LENGTH_STEP, BatchedDecoder  # noqa: E402


@pytest.fixture(scope="module")
def model(tiny_dir: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32).eval()


def test_the_cache_grows_by_a_quarter_not_twice_and_keeps_its_contents(model):
    decoder = BatchedDecoder(model, max_rows=8, context_length=4096, initial_capacity=256)
    decoder.ensure_capacity(3, 100)
    assert (decoder.rows_cap, decoder.len_cap) == (4, 256)
    decoder.k_cache[0][2, :, 99] = 7.0
    decoder.ensure_capacity(3, 257)
    assert decoder.len_cap == 256 + LENGTH_STEP  # doubling gave 512 as well; the steps differ past it
    decoder.ensure_capacity(5, 1100)
    assert decoder.rows_cap == 8
    assert 1100 <= decoder.len_cap < 1100 * 1.25 + LENGTH_STEP  # not 2048
    assert float(decoder.k_cache[0][2, :, 99].min()) == 7.0  # kept through two regrowths
    decoder.ensure_capacity(8, 5000)
    assert decoder.len_cap == 4096  # never past the context length


def test_decoding_after_regrowth_matches_a_cache_sized_up_front(model):
    prompt = list(range(5, 40))
    grown = BatchedDecoder(model, max_rows=2, context_length=512, initial_capacity=16)
    sized = BatchedDecoder(model, max_rows=2, context_length=512, initial_capacity=512)
    with torch.no_grad():
        for decoder in (grown, sized):
            decoder.prefill(0, prompt, 0)
        logits = []
        for decoder in (grown, sized):
            out = decoder.decode(torch.tensor([7]), torch.tensor([len(prompt)]))
            logits.append(out)
    assert grown.len_cap < sized.len_cap
    torch.testing.assert_close(logits[0], logits[1])
