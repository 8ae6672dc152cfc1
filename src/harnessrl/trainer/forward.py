"""The policy's forward pass: log-probs of the trained tokens at the sampling temperature.

Log-probabilities are ``log_softmax(logits / T)[token]``, the distribution the engine sampled from,
so they compare with the behaviour log-probs the gateway recorded. The LM head is applied only where
a log-prob is needed (the position before each trained token): prompts and tool output are most of
an agent's tokens, and the LM head over a 49k vocabulary at every position was the largest single
cost of a step. Both layouts end in the one head helper, ``head_logprobs``:

- ``sequence_logprobs``: rows of tokens (one sample per row, or packed rows with restarting
  position ids), the result aligned with the tokens, (B, T), 0 where nothing was computed;
- ``prefix_logprobs``: a shared-prefix micro-batch (``prefix_tree.PrefixBatch``), the result in its
  (1, N) entry layout.

With ``with_entropy`` the same logits also give each trained token's entropy at that temperature
(``algorithms.losses.token_entropy``, detached), in the same layout.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

from harnessrl.algorithms.losses import token_entropy
from harnessrl.trainer.prefix_tree import PrefixBatch


class TokenLogprobs(NamedTuple):
    logprobs: torch.Tensor  # (B, T) or (1, N); differentiable
    entropy: torch.Tensor | None  # same layout, detached; None unless asked for


def autocast_context(autocast: str, device: torch.device) -> contextlib.AbstractContextManager[None]:
    """bfloat16 autocast for ``autocast == "bf16"`` (already resolved: ``hardware.resolve_autocast``)."""
    if autocast == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def head_logprobs(
    hidden_N_H: torch.Tensor,
    lm_head: torch.nn.Module,
    targets_N: torch.Tensor,
    temperature: float,
    *,
    with_entropy: bool,
    autocast: contextlib.AbstractContextManager[None],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target | hidden state) at ``temperature`` for N positions: (N,), and their entropies."""
    with autocast:
        logits_N_V = lm_head(hidden_N_H)
    logits_N_V = logits_N_V.float()
    if temperature != 1.0:
        logits_N_V = logits_N_V / temperature
    logp_N = logits_N_V.gather(-1, targets_N[:, None]).squeeze(-1) - logits_N_V.logsumexp(-1)
    return logp_N, (token_entropy(logits_N_V) if with_entropy else None)


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids_B_T: torch.Tensor,
    position_ids_B_T: torch.Tensor,
    temperature: float,
    loss_mask_B_T: torch.Tensor | None = None,
    *,
    with_entropy: bool = False,
    autocast: str = "none",
) -> TokenLogprobs:
    """log p(token t | tokens < t) at ``temperature``, aligned with the tokens: (B, T).

    Computed where ``loss_mask_B_T`` is set (every token but each row's first without a mask), 0
    elsewhere."""
    if loss_mask_B_T is None:
        loss_mask_B_T = torch.ones_like(input_ids_B_T, dtype=torch.bool)
    with autocast_context(autocast, input_ids_B_T.device):
        hidden_B_T_H = model.get_decoder()(
            input_ids=input_ids_B_T, position_ids=position_ids_B_T, use_cache=False
        ).last_hidden_state
    rows, cols = loss_mask_B_T[:, 1:].nonzero(as_tuple=True)  # token (b, c + 1) is trained
    logp_N, entropy_N = head_logprobs(
        hidden_B_T_H[rows, cols],  # predicted from the position before it
        model.get_output_embeddings(),
        input_ids_B_T[rows, cols + 1],
        temperature,
        with_entropy=with_entropy,
        autocast=autocast_context(autocast, input_ids_B_T.device),
    )
    at = (rows, cols + 1)
    logprobs_B_T = torch.zeros(input_ids_B_T.shape, dtype=logp_N.dtype, device=logp_N.device).index_put(
        at, logp_N
    )
    if entropy_N is None:
        return TokenLogprobs(logprobs_B_T, None)
    entropy_B_T = torch.zeros(input_ids_B_T.shape, dtype=torch.float32, device=logp_N.device)
    return TokenLogprobs(logprobs_B_T, entropy_B_T.index_put(at, entropy_N))


def prefix_logprobs(
    model: torch.nn.Module,
    batch: PrefixBatch,
    temperature: float,
    *,
    with_entropy: bool = False,
    autocast: str = "none",
) -> TokenLogprobs:
    """Log-probs of a shared-prefix micro-batch's trained tokens, in its (1, N) entry layout."""
    mask_B_1_T_T = batch.attention_B_T_T[:, None]
    if model.config._attn_implementation != "sdpa":
        # eager attention adds the mask to the scores; sdpa takes True = attend
        mask_B_1_T_T = torch.zeros(mask_B_1_T_T.shape).masked_fill(
            ~mask_B_1_T_T, torch.finfo(torch.float32).min
        )
    device = batch.input_ids_B_T.device
    with autocast_context(autocast, device):
        hidden_B_T_H = model.get_decoder()(
            input_ids=batch.input_ids_B_T,
            position_ids=batch.position_ids_B_T,
            attention_mask=mask_B_1_T_T,
            use_cache=False,
        ).last_hidden_state
    logp_N, entropy_N = head_logprobs(
        hidden_B_T_H[batch.hidden_row_N, batch.hidden_col_N],
        model.get_output_embeddings(),
        batch.targets_N,
        temperature,
        with_entropy=with_entropy,
        autocast=autocast_context(autocast, device),
    )
    return TokenLogprobs(logp_N[None], None if entropy_N is None else entropy_N[None])
