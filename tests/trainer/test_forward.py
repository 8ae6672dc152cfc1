"""The chunked LM-head log-probs (``forward.ChunkedHeadLogprobs``) equal a full log-softmax's values,
entropies and gradients, for the head, the hidden states and a tied embedding, at any chunk size."""

from __future__ import annotations

import contextlib

import pytest
import torch

from harnessrl.algorithms.losses import token_entropy
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.trainer.forward import head_logprobs, sequence_logprobs
from harnessrl.trainer.policy import TrainablePolicy


def full_logprobs(hidden_N_H, weight_V_H, targets_N, temperature):
    logits_N_V = (hidden_N_H @ weight_V_H.T) / temperature
    return logits_N_V.log_softmax(-1).gather(-1, targets_N[:, None]).squeeze(-1), logits_N_V


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_values_entropies_and_gradients_equal_the_full_log_softmax(chunk, temperature):
    torch.manual_seed(0)
    N, H, V = 50, 32, 300
    hidden = torch.randn(N, H, requires_grad=True)
    head = torch.nn.Linear(H, V, bias=False)
    targets = torch.randint(0, V, (N,))
    weights_N = torch.randn(N)  # a loss that weighs each token differently, as the PPO loss does

    logp, entropy = head_logprobs(
        hidden, head, targets, temperature, with_entropy=True, autocast=contextlib.nullcontext(), chunk=chunk
    )
    (logp * weights_N).sum().backward()
    got = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad = head.weight.grad = None

    ref, logits = full_logprobs(hidden, head.weight, targets, temperature)
    (ref * weights_N).sum().backward()
    torch.testing.assert_close(logp, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, token_entropy(logits.detach()), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[0], hidden.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got[1], head.weight.grad, rtol=1e-4, atol=1e-6)
    assert got[1].abs().sum() > 0  # control: the gradient reaches the head


def test_chunked_head_in_the_model_gives_the_plain_heads_logprobs_and_gradients():
    """SmolLM2-style tied embeddings: the head's gradient lands in the embedding, as without chunks."""
    policy = TrainablePolicy(tiny_model_dir(), total_steps=1)
    model = policy.model
    ids = torch.randint(5, 500, (2, 24))
    positions = torch.arange(24).repeat(2, 1)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, 10:] = True

    out = sequence_logprobs(model, ids, positions, 0.8, mask, with_entropy=True)
    out.logprobs.sum().backward()
    chunked = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)

    # The plain path: the same head behind a wrapper module, which the chunked path does not take.
    class Wrapped(torch.nn.Module):
        def __init__(self, head):
            super().__init__()
            self.head = head

        def forward(self, x):
            return self.head(x)

    wrapped = Wrapped(model.get_output_embeddings())
    original = model.get_output_embeddings
    model.get_output_embeddings = lambda: wrapped
    try:
        plain = sequence_logprobs(model, ids, positions, 0.8, mask, with_entropy=True)
        plain.logprobs.sum().backward()
    finally:
        model.get_output_embeddings = original
    torch.testing.assert_close(out.logprobs, plain.logprobs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.entropy, plain.entropy, rtol=1e-5, atol=1e-5)
    assert chunked.keys() == {n for n, p in model.named_parameters() if p.grad is not None}
    for name, param in model.named_parameters():
        torch.testing.assert_close(chunked[name], param.grad, rtol=1e-4, atol=1e-6, msg=name)
