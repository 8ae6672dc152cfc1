"""Policy-gradient losses (torch): PPO clipped ratio, truncated importance weights, k3 KL, and
aggregation modes that stay exact across micro-batches.

Token alignment: every ``*_B_T`` tensor is aligned with ``input_ids_B_T``; ``logprobs_B_T[b, t]`` is
log p(input_ids[b, t] | input_ids[b, :t]) (``token_logprobs`` builds it from logits; position 0,
always a prompt token, gets 0).

Per token (only where ``loss_mask`` is 1; elsewhere the loss and its gradient are exactly 0):

    ratio = exp(logprobs - prox)                        prox = behaviour (engine) logprobs, or the
                                                        trainer's old logprobs if given
    pg    = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))       (PPO, DAPO bounds)
    pg    = min(pg, -A * dual_clip)  where A < 0                                  (dual clip, optional)
    pg    = pg * min(exp(old - behaviour), tis_cap)   only when old logprobs are given (TIS)
    loss  = pg + kl_coef * k3(logprobs, ref)            k3 = exp(ref - lp) - (ref - lp) - 1

Aggregation (``LOSS_AGGREGATIONS``) turns per-token losses into a scalar with *step* normalizers
(``StepTotals``), so that the sum over micro-batches equals the whole-step loss exactly:

- ``rollout_token_mean`` (default): token weight ``1 / (tokens of its rollout * rollouts in step)``:
  every rollout weighs the same however many samples it split into.
- ``token_mean``: ``1 / loss tokens in step`` (DAPO / Dr. GRPO style).
- ``seq_mean_token_mean``: ``1 / (tokens of its sample * samples in step)`` (original GRPO).

Departures from the papers: the PPO ratio is taken against the engine's behaviour logprobs by
default (``AlgorithmConfig.proximal = "behaviour"``: no separate old-policy forward pass), which is
exact for one optimizer step per batch of on-policy rollouts. To separate engine/trainer drift from
policy change, pass ``old_logprobs_B_T`` (decoupled PPO: clip against the trainer's old policy,
correct the engine mismatch with the truncated importance weight, as in Yao et al. 2025 "TIS"); the
native trainer does so with ``proximal = "trainer"``, its own logprobs detached (one optimizer step
per batch: the ratio is then 1 and the weight ``min(exp(old - behaviour), tis_cap)`` is what acts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.algorithms.packing import StepTotals
from harnessrl.errors import ConfigError, EmptyBatch, InvalidBatch
from harnessrl.trajectory import Sample
from harnessrl.trajectory.samples import loss_token_outside_spans

_MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: keeps ratios finite; such tokens are clipped anyway


@dataclass(slots=True)
class MicroBatch:
    """Tensors of one micro-batch. Padded layout: one sample per row. Packed layout: all samples
    concatenated in one row, ``position_ids`` restarting per sample. A transformers model keeps
    attention inside each sample only when called with ``use_cache=False``: with its KV cache on it
    ignores the restarts (``docs/trajectories.md``, "Micro-batches"; ``trainer/train_step.py``,
    "Packed rows")."""

    input_ids_B_T: torch.Tensor  # (B, T) long
    position_ids_B_T: torch.Tensor  # (B, T) long
    loss_mask_B_T: torch.Tensor  # (B, T) bool
    behaviour_logprobs_B_T: torch.Tensor  # (B, T) float
    advantages_B_T: torch.Tensor  # (B, T) float
    rollout_index_B_T: torch.Tensor  # (B, T) long, index into StepTotals.rollout_token_counts_R
    sample_index_B_T: torch.Tensor  # (B, T) long, index into StepTotals.sample_token_counts_S


def collate(
    samples: Sequence[Sample],
    totals: StepTotals,
    *,
    packed: bool = True,
    pad_token_id: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> MicroBatch:
    """Tensors for one micro-batch of samples (each must have its ``advantage`` assigned).

    ``dtype`` is that of the float tensors (behaviour logprobs, advantages): a floating-point torch
    dtype, else ``ConfigError``. A sample whose first token has loss mask 1, or whose per-token lists
    differ in length, is an ``InvalidBatch`` naming it: nothing in the sample predicts its first
    token, which a packed row would score from the end of the sample before it (and a padded row
    with the constant 0 of ``token_logprobs``). So is one with loss mask 1 on a token none of its
    spans sampled (``trajectory.samples.loss_token_outside_spans``), naming that token.
    """
    if not samples:
        raise EmptyBatch("cannot collate an empty micro-batch")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        # torch.int64 truncated every advantage and log-prob toward 0 (0.5 -> 0): nothing learned
        raise ConfigError(f"dtype is {dtype!r}, not a torch floating-point dtype")
    for s in samples:
        where = f"sample {s.sample_index} of rollout {s.rollout_id}"
        if not len(s.input_ids) == len(s.loss_mask) == len(s.behaviour_logprobs):
            raise InvalidBatch(
                f"{where}: input_ids, loss_mask and behaviour_logprobs have lengths {len(s.input_ids)}, "
                f"{len(s.loss_mask)} and {len(s.behaviour_logprobs)} (they must be equal)"
            )
        if s.loss_mask and s.loss_mask[0]:
            raise InvalidBatch(
                f"{where}: its first token has loss mask 1, but no token before it predicts it"
            )
        if (outside := loss_token_outside_spans(s.loss_mask, s.spans)) is not None:
            # A hand-built sample's tool output or template glue, trained as if the policy had
            # sampled it, against a behaviour log-prob of 0.0 (probability 1).
            raise InvalidBatch(
                f"{where}: loss_mask[{outside}] is 1 but no span holds token {outside}: only sampled "
                "tokens are trained"
            )
    rows = [list(samples)] if packed else [[s] for s in samples]
    T = max(sum(len(s) for s in row) for row in rows)
    B = len(rows)
    ids = torch.full((B, T), pad_token_id, dtype=torch.long)
    pos = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.bool)
    beh = torch.zeros((B, T), dtype=dtype)
    adv = torch.zeros((B, T), dtype=dtype)
    ridx = torch.zeros((B, T), dtype=torch.long)
    sidx = torch.zeros((B, T), dtype=torch.long)
    for b, row in enumerate(rows):
        t = 0
        for s in row:
            if s.advantage is None:
                raise InvalidBatch(f"sample of rollout {s.rollout_id} has no advantage")
            n = len(s)
            ids[b, t : t + n] = torch.tensor(s.input_ids, dtype=torch.long)
            pos[b, t : t + n] = torch.arange(n)
            mask[b, t : t + n] = torch.tensor(s.loss_mask, dtype=torch.bool)
            beh[b, t : t + n] = torch.tensor(s.behaviour_logprobs, dtype=dtype)
            adv[b, t : t + n] = s.advantage
            ridx[b, t : t + n] = totals.rollout_index(s)
            sidx[b, t : t + n] = totals.sample_index(s)
            t += n
    tensors = [ids, pos, mask, beh, adv, ridx, sidx]
    if device is not None:
        tensors = [x.to(device) for x in tensors]
    return MicroBatch(*tensors)


def token_logprobs(logits_B_T_V: torch.Tensor, input_ids_B_T: torch.Tensor) -> torch.Tensor:
    """Log-probability of each token given the ones before it, aligned with ``input_ids``: (B, T)."""
    logits = logits_B_T_V[:, :-1].float()  # (B, T-1, V): position t predicts token t+1
    target = input_ids_B_T[:, 1:, None]  # (B, T-1, 1)
    logp = logits.gather(-1, target).squeeze(-1) - logits.logsumexp(-1)  # (B, T-1)
    return F.pad(logp, (1, 0))  # (B, T): position 0 has no prediction


#: ``token_entropy`` works on chunks of rows of at most this many logits (16 MiB of fp32 each), so
#: its two temporaries stay small whatever the number of tokens and the vocabulary size.
ENTROPY_CHUNK_ELEMENTS = 1 << 22


@torch.no_grad()
def token_entropy(logits_N_V: torch.Tensor, *, chunk_elements: int = ENTROPY_CHUNK_ELEMENTS) -> torch.Tensor:
    """Entropy ``-sum_v p_v log p_v`` of each row's distribution ``p = softmax(logits)``: (N,), fp32.

    Pass logits already divided by the sampling temperature to get the entropy of the distribution
    the engine sampled from. No autograd graph is kept (it is a metric), and rows are processed in
    chunks of at most ``chunk_elements`` logits, so the extra memory is two (chunk, V) temporaries.
    A logit of -inf (a token that cannot be sampled) contributes 0, not NaN.
    """
    N, V = logits_N_V.shape
    out_N = torch.empty(N, dtype=torch.float32, device=logits_N_V.device)
    rows = max(1, chunk_elements // max(1, V))
    for start in range(0, N, rows):
        logp = logits_N_V[start : start + rows].float().log_softmax(-1)  # (n, V)
        p = logp.exp()
        logp.clamp_(min=torch.finfo(logp.dtype).min)  # where p is 0: 0 * finite, not 0 * -inf
        out_N[start : start + rows] = -p.mul_(logp).sum(-1)
    return out_N


def ppo_clip_loss(
    log_ratio_B_T: torch.Tensor,
    advantages_B_T: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO clipped surrogate (to minimize), with where the clip and dual clip are active."""
    ratio = torch.exp(log_ratio_B_T)  # (B, T)
    pg_unclipped = -advantages_B_T * ratio
    pg_clipped = -advantages_B_T * ratio.clamp(1 - clip_low, 1 + clip_high)
    loss = torch.maximum(pg_unclipped, pg_clipped)  # (B, T)
    clipped = pg_clipped > pg_unclipped
    dual = torch.zeros_like(clipped)
    if dual_clip is not None:
        cap = -advantages_B_T * dual_clip
        dual = (advantages_B_T < 0) & (loss > cap)
        loss = torch.where(dual, cap, loss)
    return loss, clipped, dual


def k3_kl(logprobs_B_T: torch.Tensor, ref_logprobs_B_T: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref) per token: exp(d) - d - 1 with d = ref - logprobs."""
    d = (ref_logprobs_B_T - logprobs_B_T).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return torch.exp(d) - d - 1


# -- aggregation: per-token weights from step totals -------------------------------------------------
TokenWeights = Callable[[torch.Tensor, torch.Tensor, StepTotals], torch.Tensor]


def _rollout_token_mean(rollout_index_B_T: torch.Tensor, sample_index_B_T: torch.Tensor, totals: StepTotals):
    counts_R = torch.tensor(
        totals.rollout_token_counts_R, dtype=torch.float64, device=rollout_index_B_T.device
    )
    return 1.0 / (counts_R.clamp(min=1)[rollout_index_B_T] * max(totals.num_rollouts, 1))


def _token_mean(rollout_index_B_T: torch.Tensor, sample_index_B_T: torch.Tensor, totals: StepTotals):
    return torch.full(
        rollout_index_B_T.shape,
        1.0 / max(totals.num_loss_tokens, 1),
        dtype=torch.float64,
        device=rollout_index_B_T.device,
    )


def _seq_mean_token_mean(rollout_index_B_T: torch.Tensor, sample_index_B_T: torch.Tensor, totals: StepTotals):
    counts_S = torch.tensor(totals.sample_token_counts_S, dtype=torch.float64, device=sample_index_B_T.device)
    return 1.0 / (counts_S.clamp(min=1)[sample_index_B_T] * max(totals.num_samples, 1))


LOSS_AGGREGATIONS: dict[str, TokenWeights] = {
    "rollout_token_mean": _rollout_token_mean,
    "token_mean": _token_mean,
    "seq_mean_token_mean": _seq_mean_token_mean,
}


#: Every metric ``policy_loss`` can report, in a fixed order (it reports a subset, by config): a
#: distributed step reduces them by position in one tensor (``trainer/train_step.py``). Names ending
#: in ``_max`` are maxima, ``loss_tokens`` a count, the rest means over the micro-batch's loss tokens.
LOSS_METRICS: tuple[str, ...] = (
    "loss_tokens",
    "clip_fraction",
    "dual_clip_fraction",
    "approx_kl",
    "ratio_mean",
    "ratio_max",
    "importance_weight_mean",
    "importance_weight_max",
    "engine_trainer_kl",
    "importance_weight_truncated_fraction",
    "kl_ref",
)


@dataclass(slots=True)
class PolicyLoss:
    """A micro-batch's share of the step loss (sum these over micro-batches) and its metrics.

    Metrics are means over this micro-batch's loss tokens; ``loss_tokens`` lets a caller weigh them.
    """

    loss: torch.Tensor
    metrics: dict[str, float]


def _per_token(x: torch.Tensor, like_B_T: torch.Tensor) -> torch.Tensor:
    return x[:, None].expand_as(like_B_T) if x.dim() == 1 else x


def policy_loss(
    logprobs_B_T: torch.Tensor,
    behaviour_logprobs_B_T: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask_B_T: torch.Tensor,
    rollout_index: torch.Tensor,
    totals: StepTotals,
    config: AlgorithmConfig,
    *,
    sample_index: torch.Tensor | None = None,
    old_logprobs_B_T: torch.Tensor | None = None,
    ref_logprobs_B_T: torch.Tensor | None = None,
) -> PolicyLoss:
    """The PPO/TIS/KL loss of one micro-batch, normalized by ``totals`` (see the module docstring).

    ``advantages``, ``rollout_index`` and ``sample_index`` are per row ``(B,)`` or per token
    ``(B, T)`` and index into ``totals`` (``StepTotals.rollout_index`` / ``sample_index``);
    ``sample_index`` is required only by ``seq_mean_token_mean``.
    """
    mask = loss_mask_B_T.bool()  # (B, T)
    behaviour_logprobs_B_T = behaviour_logprobs_B_T.detach()  # recorded data, never differentiated
    A = _per_token(advantages, logprobs_B_T).to(logprobs_B_T.dtype)  # (B, T)
    ridx = _per_token(rollout_index, logprobs_B_T)  # (B, T)
    if sample_index is None:
        if config.loss_agg == "seq_mean_token_mean":
            raise InvalidBatch("seq_mean_token_mean needs sample_index")
        sample_index = torch.zeros_like(ridx)
    sidx = _per_token(sample_index, logprobs_B_T)  # (B, T)

    def masked(x: torch.Tensor) -> torch.Tensor:
        # where(), not multiply: padding may hold -inf/NaN and must give exactly zero gradient
        return torch.where(mask, x, torch.zeros_like(x))

    prox_B_T = behaviour_logprobs_B_T if old_logprobs_B_T is None else old_logprobs_B_T.detach()
    log_ratio = masked(logprobs_B_T - prox_B_T).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)  # (B, T)
    pg_B_T, clipped, dual = ppo_clip_loss(
        log_ratio, A, clip_low=config.clip_low, clip_high=config.clip_high, dual_clip=config.dual_clip
    )

    is_weight = torch.ones_like(pg_B_T)
    if old_logprobs_B_T is not None:
        drift = masked(old_logprobs_B_T.detach() - behaviour_logprobs_B_T).clamp(
            -_MAX_LOG_RATIO, _MAX_LOG_RATIO
        )
        is_weight = torch.exp(drift)  # (B, T) pi_trainer_old / pi_engine
        if config.tis_cap is not None:
            is_weight = is_weight.clamp(max=config.tis_cap)
        pg_B_T = pg_B_T * is_weight

    loss_B_T = pg_B_T
    kl_B_T = None
    if config.kl_coef > 0:
        if ref_logprobs_B_T is None:
            raise ConfigError("kl_coef > 0 needs ref_logprobs_B_T")
        kl_B_T = k3_kl(masked(logprobs_B_T), masked(ref_logprobs_B_T.detach()))
        loss_B_T = loss_B_T + config.kl_coef * kl_B_T

    weights_B_T = LOSS_AGGREGATIONS[config.loss_agg](ridx, sidx, totals).to(loss_B_T.dtype)
    loss = (masked(loss_B_T) * weights_B_T).sum()

    with torch.no_grad():
        n = int(mask.sum())
        denom = max(n, 1)
        ratio = torch.exp(log_ratio)

        def mean(x: torch.Tensor) -> float:
            return float(masked(x.float()).sum() / denom)

        metrics = {
            "loss_tokens": float(n),
            "clip_fraction": mean(clipped),
            "dual_clip_fraction": mean(dual),
            "approx_kl": mean(ratio - 1 - log_ratio),  # k3 estimate of KL(prox || current)
            "ratio_mean": mean(ratio),
            "ratio_max": float(masked(ratio).max()) if n else 0.0,
            "importance_weight_mean": mean(is_weight),
            "importance_weight_max": float(masked(is_weight).max()) if n else 0.0,
        }
        if old_logprobs_B_T is not None:
            drift = masked(old_logprobs_B_T - behaviour_logprobs_B_T)  # log r, r = p_trainer / p_engine
            # k3 of KL(engine || trainer): the tokens were sampled by the engine, so r - 1 - log r
            # (clamped as the weight is: the metric stays finite where the two disagree wildly).
            log_r = drift.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
            metrics["engine_trainer_kl"] = mean(torch.exp(log_r) - 1 - log_r)
            if config.tis_cap is not None:
                metrics["importance_weight_truncated_fraction"] = mean(torch.exp(drift) > config.tis_cap)
        if kl_B_T is not None:
            metrics["kl_ref"] = mean(kl_B_T)
    return PolicyLoss(loss=loss, metrics=metrics)


def micro_batch_loss(
    logprobs_B_T: torch.Tensor,
    batch: MicroBatch,
    totals: StepTotals,
    config: AlgorithmConfig,
    *,
    old_logprobs_B_T: torch.Tensor | None = None,
    ref_logprobs_B_T: torch.Tensor | None = None,
) -> PolicyLoss:
    """``policy_loss`` on a ``MicroBatch`` made by ``collate``."""
    return policy_loss(
        logprobs_B_T,
        batch.behaviour_logprobs_B_T,
        batch.advantages_B_T,
        batch.loss_mask_B_T,
        batch.rollout_index_B_T,
        totals,
        config,
        sample_index=batch.sample_index_B_T,
        old_logprobs_B_T=old_logprobs_B_T,
        ref_logprobs_B_T=ref_logprobs_B_T,
    )
