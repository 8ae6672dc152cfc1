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
