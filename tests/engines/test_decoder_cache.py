"""``BatchedDecoder``'s KV cache grows as its rows need it: by an eighth of its length (at least
``LENGTH_STEP`` positions), rows to a multiple of ``ROW_STEP``; it keeps what it holds, and decodes
after growing as a cache sized up front does."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from harnessrl.engines.decoder import LENGTH_STEP, ROW_STEP, BatchedDecoder  # noqa: E402


@pytest.fixture(scope="module")
def model(tiny_dir: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32).eval()


def test_the_cache_grows_by_an_eighth_and_keeps_its_contents(model):
    decoder = BatchedDecoder(model, max_rows=32, context_length=4096, initial_capacity=256)
    assert decoder.k_cache == [] and decoder.rows_cap == 0  # nothing until a row needs it
    decoder.ensure_capacity(3, 100)
    assert (decoder.rows_cap, decoder.len_cap) == (ROW_STEP, 256)
    decoder.k_cache[0][2, :, 99] = 7.0
    decoder.ensure_capacity(3, 266)  # the arithmetic example's first prompt
    assert decoder.len_cap == 256 + LENGTH_STEP  # 320, not the 512 a 256-position step gave
    assert decoder.k_cache[0].shape == (ROW_STEP, decoder.n_kv, 256 + LENGTH_STEP, decoder.head_dim)
    decoder.ensure_capacity(ROW_STEP + 1, 1100)
    assert decoder.rows_cap == 2 * ROW_STEP  # not doubled to the next power of two past 9 rows...
    decoder.ensure_capacity(3 * ROW_STEP - 1, 1100)
    assert decoder.rows_cap == 3 * ROW_STEP  # ...nor to 32 for 23 rows
    assert 1100 <= decoder.len_cap < 1100 * 1.125 + LENGTH_STEP  # not 2048, nor 1.25 x 1100
    assert float(decoder.k_cache[0][2, :, 99].min()) == 7.0  # kept through every regrowth
    decoder.ensure_capacity(40, 5000)
    assert (decoder.rows_cap, decoder.len_cap) == (32, 4096)  # never past max_rows or the context


def test_the_cache_does_not_shrink_while_rows_use_it_and_is_freed_by_release(model):
    decoder = BatchedDecoder(model, max_rows=32, context_length=4096)
    decoder.ensure_capacity(20, 700)
    rows, length = decoder.rows_cap, decoder.len_cap
    decoder.ensure_capacity(2, 300)  # fewer, shorter rows: what is there stays (no copy back and forth)
    assert (decoder.rows_cap, decoder.len_cap) == (rows, length)
    decoder.release()
    assert decoder.k_cache == [] and (decoder.rows_cap, decoder.len_cap) == (0, 0)


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
