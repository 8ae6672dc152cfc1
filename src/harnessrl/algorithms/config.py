"""``AlgorithmConfig``: the advantage estimator, zero-variance policy and loss settings of a run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from harnessrl.config import Section


class AlgorithmConfig(Section):
    """RL algorithm settings. Defaults are the recommended settings.

    - ``advantage``: a key of ``ADVANTAGE_ESTIMATORS`` (``grpo``, ``dr_grpo``, ``rloo``, ``reinforce_pp``).
    - ``zero_variance_groups``: ``keep`` groups whose rollouts all got the same reward (their
      advantages are 0 but they still count in the loss normalization), or ``drop`` them.
    - ``clip_low`` / ``clip_high``: PPO ratio clipped to ``[1 - clip_low, 1 + clip_high]`` (DAPO's
      asymmetric "clip-higher" by default).
    - ``dual_clip``: for negative advantages, cap the loss at ``-A * dual_clip`` (> 1; off when None).
    - ``proximal``: the policy the PPO ratio is taken against. ``behaviour``: the engine's recorded
      logprobs (exact for one optimizer step per batch of on-policy rollouts). ``trainer``: the
      trainer's own logprobs before the update (decoupled PPO), with the engine/trainer mismatch
      corrected by the importance weight ``min(pi_trainer_old / pi_engine, tis_cap)`` (TIS).
    - ``tis_cap``: that truncation, with ``proximal = "trainer"`` only (None: untruncated; 2 is
      Yao et al.'s choice). Refused with ``behaviour``, where there is no such weight.
    - ``kl_coef``: weight of the k3 KL penalty to a reference policy, a frozen copy of the weights
      training starts from (0: off, and no reference model is loaded).
    - ``loss_agg``: ``rollout_token_mean`` (each rollout weighs the same), ``token_mean`` or
      ``seq_mean_token_mean``.

    Every number must be finite: ``kl_coef = inf`` made the loss of every token NaN (``inf * 0``
    where the policy equals the reference, as at the first step) and ``eps = inf`` every advantage
    0. No value means "off" (``dual_clip``, ``tis_cap``).
    """

    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"] = "grpo"
    eps: float = Field(default=1e-6, gt=0, allow_inf_nan=False)
    zero_variance_groups: Literal["keep", "drop"] = "keep"
    clip_low: float = Field(default=0.2, ge=0, lt=1, allow_inf_nan=False)
    clip_high: float = Field(default=0.28, ge=0, allow_inf_nan=False)
    dual_clip: float | None = Field(default=None, gt=1, allow_inf_nan=False)
    proximal: Literal["behaviour", "trainer"] = "behaviour"
    tis_cap: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    kl_coef: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    loss_agg: Literal["rollout_token_mean", "token_mean", "seq_mean_token_mean"] = "rollout_token_mean"

    @model_validator(mode="after")
    def _check(self) -> AlgorithmConfig:
        if self.dual_clip is not None and self.dual_clip <= 1 + self.clip_high:
            raise ValueError("dual_clip must be greater than 1 + clip_high")
        if self.tis_cap is not None and self.proximal != "trainer":
            raise ValueError(
                'tis_cap: applies only with proximal = "trainer" (it truncates the importance weight '
                "pi_trainer_old / pi_engine); with the behaviour proximal there is no such weight"
            )
        return self
