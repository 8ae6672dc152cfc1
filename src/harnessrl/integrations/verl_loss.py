"""harnessrl's rollout-level policy loss, registered in verl's policy-loss registry.

verl's actors (``verl.workers.utils.losses.ppo_loss``) look the policy loss up by name with
``get_policy_loss_fn(actor.policy_loss.loss_mode)``. Importing this module registers
``"harnessrl_rollout"`` (``LOSS_NAME``): the same per-token PPO surrogate as
``harnessrl.algorithms.losses.policy_loss``, aggregated with harnessrl's ``rollout_token_mean``
weight ``1 / (loss tokens of the token's rollout * rollouts in the step)``, so every rollout weighs
the same however many samples (chains) it split into.

Where this departs from verl's built-in losses:

- verl's ``PolicyLossFn`` receives only per-token tensors (old/current log-probs, advantages,
  response mask, ``rollout_is_weights``), not the rest of the batch. The per-rollout token counts
  travel in the batch as ``rollout_loss_tokens`` and ``step_rollouts`` (one value per row, written by
  ``samples_to_dataproto``); ``harnessrl_ppo_loss`` (a drop-in for verl's ``ppo_loss``, installed with
  ``set_loss_fn``) turns them into per-row weights for the micro-batch at hand and hands them to the
  registered function through a context variable. Called directly, the function also takes them
  as the keyword ``rollout_weights``. Without either it raises instead of silently token-averaging.
- ``loss_agg_mode`` is ignored by the policy term (it is what this loss replaces); verl still uses it
  for the entropy bonus and the KL loss, which therefore stay token-averaged (harnessrl weighs its
  KL term per rollout as well). Keep ``kl_coef`` 0 or accept that difference.
- Dual clip follows verl: ``actor.clip_ratio_c`` caps the loss of negative-advantage tokens;
  ``clip_ratio_c = inf`` turns it off (harnessrl's default, ``dual_clip = None``).
- Truncated importance sampling: verl's ``rollout_is_weights`` (``algorithm.rollout_correction``
  with ``rollout_is="token"``, ``rollout_is_threshold=tis_cap``) are the same weights as harnessrl's
  ``min(exp(old - behaviour), tis_cap)``; they multiply the per-token loss as in harnessrl.

The weights are *step* normalizers: the loss of a micro-batch is its share of the step loss, and the
sum over micro-batches (and data-parallel ranks: the loss is scaled by ``dp_size`` because FSDP
averages gradients over ranks) is the whole-step loss. So one verl mini-batch must be one harnessrl
step: ``ppo_epochs=1`` and a mini-batch holding every row of the ``DataProto``.
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from typing import Any

import torch
from verl.trainer.ppo.core_algos import register_policy_loss

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.algorithms.losses import ppo_clip_loss

#: Name of the policy loss in verl's registry (``actor_rollout_ref.actor.policy_loss.loss_mode``).
LOSS_NAME = "harnessrl_rollout"
#: Batch keys (one value per row) that carry the step's rollout-level normalizers.
ROLLOUT_TOKENS_KEY = "rollout_loss_tokens"
STEP_ROLLOUTS_KEY = "step_rollouts"

_MAX_LOG_RATIO = 20.0  # same bound as harnessrl.algorithms.losses and verl's vanilla loss

# Per-row rollout weights of the micro-batch being scored; set by harnessrl_ppo_loss around verl's
# ppo_loss, which gives the registered function no other way to see batch keys.
_ROLLOUT_WEIGHTS: ContextVar[torch.Tensor | None] = ContextVar("harnessrl_rollout_weights", default=None)


def rollout_token_weights(rollout_loss_tokens: torch.Tensor, step_rollouts: torch.Tensor) -> torch.Tensor:
    """Per-row weight of each loss token, ``1 / (loss tokens of its rollout * rollouts in step)``: (B,).

    float64, computed exactly as ``harnessrl.algorithms.losses`` does (counts clamped to at least 1).
    """
    n_B = rollout_loss_tokens.to(torch.float64).clamp(min=1)
    r_B = step_rollouts.to(torch.float64).clamp(min=1)
    return 1.0 / (n_B * r_B)


def _clip_bounds(config: Any) -> tuple[float, float, float | None]:
    clip = config.clip_ratio
    low = config.clip_ratio_low if config.clip_ratio_low is not None else clip
    high = config.clip_ratio_high if config.clip_ratio_high is not None else clip
    c = float(config.get("clip_ratio_c", 3.0))
    if not c > 1.0:
        raise ValueError(f"clip_ratio_c must be greater than 1 (inf turns dual clip off), got {c}")
    return float(low), float(high), None if math.isinf(c) else c


@register_policy_loss(LOSS_NAME)  # type: ignore[arg-type]
def compute_policy_loss_harnessrl_rollout(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    rollout_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """PPO clipped loss of one micro-batch with harnessrl's rollout-level normalization.

    All tensors are ``(B, L)`` over the response part of the rows; ``rollout_weights`` is ``(B,)`` or
    ``(B, L)`` (see ``rollout_token_weights``), defaulting to the ones ``harnessrl_ppo_loss`` set.
    ``config`` is verl's ``ActorConfig`` (clip ratios, ``clip_ratio_c``, ``global_batch_info``).
    """
    if config is None:
        raise ValueError(f"{LOSS_NAME} needs the actor config (clip ratios)")
    weights = rollout_weights if rollout_weights is not None else _ROLLOUT_WEIGHTS.get()
    if weights is None:
        raise ValueError(
            f"{LOSS_NAME} needs per-rollout weights: install harnessrl.integrations.verl.harnessrl_ppo_loss "
            "as the actor's loss function (batch built by samples_to_dataproto), or pass rollout_weights"
        )
    mask = response_mask.bool()  # (B, L)
    if weights.dim() == 1:
        weights = weights[:, None].expand(mask.shape)  # (B, L)
    if weights.shape != mask.shape:
        raise ValueError(f"rollout_weights has shape {tuple(weights.shape)}, expected {tuple(mask.shape)}")
    clip_low, clip_high, dual_clip = _clip_bounds(config)

    def masked(x: torch.Tensor) -> torch.Tensor:
        # where(), not multiply: padding may hold -inf/NaN and must give exactly zero gradient
        return torch.where(mask, x, torch.zeros_like(x))

    log_ratio = masked(log_prob - old_log_prob.detach()).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)  # (B, L)
    A = advantages.to(log_prob.dtype)  # (B, L)
    pg, clipped, dual = ppo_clip_loss(
        log_ratio, A, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
    )
    if rollout_is_weights is not None:
        pg = pg * rollout_is_weights.detach()
    # FSDP averages gradients over data-parallel ranks; the weights already are whole-step weights.
    dp_size = int(config.global_batch_info.get("dp_size", 1) or 1)
    loss = (masked(pg) * weights.to(pg.dtype)).sum() * dp_size

    with torch.no_grad():
        denom = max(int(mask.sum()), 1)
        metrics = {
            "actor/pg_clipfrac": float(masked(clipped.float()).sum() / denom),
            "actor/ppo_kl": float(masked(-log_ratio).sum() / denom),
            "actor/pg_clipfrac_lower": float(masked(dual.float()).sum() / denom),
        }
    return loss, metrics


def harnessrl_ppo_loss(config: Any, model_output: Any, data: Any, dp_group: Any = None) -> Any:
    """verl's ``ppo_loss`` with the micro-batch's rollout weights made visible to ``LOSS_NAME``.

    Same signature as ``verl.workers.utils.losses.ppo_loss``; install it on the actor worker with
    ``set_loss_fn(functools.partial(harnessrl_ppo_loss, config=actor_config))``.
    """
    from verl.workers.utils.losses import ppo_loss  # the worker stack; imported only where used

    missing = [k for k in (ROLLOUT_TOKENS_KEY, STEP_ROLLOUTS_KEY) if k not in data]
    if missing:
        raise ValueError(
            f"batch lacks {missing}: build it with harnessrl.integrations.verl.samples_to_dataproto"
        )
    weights_B = rollout_token_weights(data[ROLLOUT_TOKENS_KEY], data[STEP_ROLLOUTS_KEY])
    token = _ROLLOUT_WEIGHTS.set(weights_B)
    try:
        return ppo_loss(config, model_output, data, dp_group)
    finally:
        _ROLLOUT_WEIGHTS.reset(token)


_LOSS_AGG_MODES = {
    "rollout_token_mean": (LOSS_NAME, "token-mean"),  # token-mean then applies to entropy / KL only
    "token_mean": ("vanilla", "token-mean"),
    "seq_mean_token_mean": ("vanilla", "seq-mean-token-mean"),
}


def verl_actor_overrides(config: AlgorithmConfig, prefix: str = "actor_rollout_ref.actor.") -> dict[str, Any]:
    """verl actor settings (Hydra override keys) that reproduce a harnessrl ``AlgorithmConfig``'s loss.

    The advantage estimator is not among them: advantages come computed per rollout in the batch.
    Nor are ``proximal`` and ``tis_cap``, which are not actor settings: with ``proximal = "trainer"``
    build the batch with ``samples_to_dataproto(..., old_log_probs=False)``, have verl recompute
    ``old_log_probs`` and set ``algorithm.rollout_correction`` (``docs/verl.md``, "TIS"); with the
    default ``old_log_probs=True`` the ratio is taken against the behaviour log-probs.
    """
    loss_mode, agg_mode = _LOSS_AGG_MODES[config.loss_agg]
    return {
        f"{prefix}policy_loss.loss_mode": loss_mode,
        f"{prefix}loss_agg_mode": agg_mode,
        f"{prefix}clip_ratio_low": config.clip_low,
        f"{prefix}clip_ratio_high": config.clip_high,
        f"{prefix}clip_ratio_c": config.dual_clip if config.dual_clip is not None else math.inf,
        f"{prefix}use_kl_loss": config.kl_coef > 0,
        f"{prefix}kl_loss_coef": config.kl_coef,
        f"{prefix}kl_loss_type": "low_var_kl",  # k3, as harnessrl (verl clamps it to [-10, 10])
        # harnessrl has no entropy bonus; a base config with one changed the loss these reproduce
        f"{prefix}entropy_coeff": 0.0,
        f"{prefix}ppo_epochs": 1,  # one optimizer step per harnessrl step
    }
