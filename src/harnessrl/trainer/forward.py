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

The head never holds the (N, V) logits of all N positions: ``ChunkedHeadLogprobs`` computes them
``HEAD_CHUNK_ROWS`` positions at a time, keeps only each position's log-normalizer, and recomputes a
chunk's logits in the backward pass (the gradient of ``logit[target] - logsumexp`` with respect to
the logits is ``onehot - softmax``). Autograd through a plain log-softmax keeps the logits, their
tempered copy and the softmax of every position until the backward: 3 x N x 49k floats, 0.6 GB for
1,000 trained tokens of SmolLM2. The recomputation costs one more LM-head matmul over the N
positions (a few percent of a step). A head that is not a bias-free ``nn.Linear`` (a LoRA-wrapped
head) takes the plain path.
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


#: Positions whose (rows, V) logits the chunked LM head holds at once: 256 x 49k floats is 50 MB.
HEAD_CHUNK_ROWS = 256


class ChunkedHeadLogprobs(torch.autograd.Function):
    """``log_softmax(hidden @ weight.T / T)[target]`` for N positions, ``chunk`` rows at a time.

    Forward: (N,) log-probs, and (N,) entropies (detached; empty unless asked for). Backward, per
    chunk of rows, with the logits recomputed: ``dlogits = g * (onehot(target) - softmax) / T``,
    ``dhidden = dlogits @ weight``, ``dweight += dlogits.T @ hidden``. Logits are computed in
    ``compute_dtype`` (bfloat16 under autocast) and normalized in float32, as the plain path does.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        hidden_N_H: torch.Tensor,
        weight_V_H: torch.Tensor,
        targets_N: torch.Tensor,
        temperature: float,
        with_entropy: bool,
        compute_dtype: torch.dtype,
        chunk: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        N = hidden_N_H.shape[0]
        logp_N = torch.empty(N, dtype=torch.float32, device=hidden_N_H.device)
        lse_N = torch.empty(N, dtype=torch.float32, device=hidden_N_H.device)
        entropy_N = torch.empty(N if with_entropy else 0, dtype=torch.float32, device=hidden_N_H.device)
        weight = weight_V_H.to(compute_dtype)
        for start in range(0, N, chunk):
            end = min(N, start + chunk)
            logits_n_V = _chunk_logits(hidden_N_H[start:end], weight, temperature)
            lse_N[start:end] = logits_n_V.logsumexp(-1)
            logp_N[start:end] = (
                logits_n_V.gather(-1, targets_N[start:end, None]).squeeze(-1) - lse_N[start:end]
            )
            if with_entropy:
                entropy_N[start:end] = token_entropy(logits_n_V)
        ctx.save_for_backward(hidden_N_H, weight_V_H, targets_N, lse_N)
        ctx.options = (temperature, compute_dtype, chunk)
        ctx.mark_non_differentiable(entropy_N)
        return logp_N, entropy_N

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad_logp_N: torch.Tensor, _grad_entropy: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        hidden_N_H, weight_V_H, targets_N, lse_N = ctx.saved_tensors  # type: ignore[attr-defined]
        temperature, compute_dtype, chunk = ctx.options  # type: ignore[attr-defined]
        weight = weight_V_H.to(compute_dtype)
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]  # type: ignore[attr-defined]
        grad_hidden = torch.zeros_like(hidden_N_H) if need_hidden else None
        grad_weight = (
            torch.zeros(weight_V_H.shape, dtype=torch.float32, device=weight_V_H.device)
            if need_weight
            else None
        )
        for start in range(0, hidden_N_H.shape[0], chunk):
            end = min(hidden_N_H.shape[0], start + chunk)
            h = hidden_N_H[start:end].to(compute_dtype)
            # dlogp/dlogits = onehot - softmax, times the chain rule's 1/T; logits -> probabilities in place
            d_n_V = _chunk_logits(h, weight, temperature).sub_(lse_N[start:end, None]).exp_().neg_()
            d_n_V.scatter_add_(-1, targets_N[start:end, None], torch.ones_like(lse_N[start:end, None]))
            d_n_V.mul_(grad_logp_N[start:end, None] / temperature)
            if grad_hidden is not None:
                grad_hidden[start:end] = (d_n_V.to(compute_dtype) @ weight).to(grad_hidden.dtype)
            if grad_weight is not None:
                grad_weight += (d_n_V.to(compute_dtype).T @ h).float()
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight_V_H.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


def _chunk_logits(hidden_n_H: torch.Tensor, weight_V_H: torch.Tensor, temperature: float) -> torch.Tensor:
    """Float32 logits at ``temperature`` for a chunk of rows: (n, V)."""
    logits_n_V = (hidden_n_H.to(weight_V_H.dtype) @ weight_V_H.T).float()
    return logits_n_V.div_(temperature) if temperature != 1.0 else logits_n_V


def head_logprobs(
    hidden_N_H: torch.Tensor,
    lm_head: torch.nn.Module,
    targets_N: torch.Tensor,
    temperature: float,
    *,
    with_entropy: bool,
    autocast: contextlib.AbstractContextManager[None],
    chunk: int = HEAD_CHUNK_ROWS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target | hidden state) at ``temperature`` for N positions: (N,), and their entropies."""
    if type(lm_head) is torch.nn.Linear and lm_head.bias is None:
        # The dtype autocast would give the head's matmul (bfloat16 under bf16 autocast).
        with autocast:
            compute_dtype = torch.mm(hidden_N_H[:1], lm_head.weight[:1].T).dtype
        logp_N, entropy_N = ChunkedHeadLogprobs.apply(
            hidden_N_H, lm_head.weight, targets_N, temperature, with_entropy, compute_dtype, chunk
        )
        return logp_N, (entropy_N if with_entropy else None)
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
        # eager attention adds the mask to the scores; sdpa takes True = attend. On the mask's device:
        # a CPU mask for a GPU model's scores fails (or copies it every layer).
        mask_B_1_T_T = torch.zeros(mask_B_1_T_T.shape, device=mask_B_1_T_T.device).masked_fill(
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
