"""Pure RL math: per-rollout advantages, step normalizers and micro-batch packing, and (torch) losses.

Importing this package never imports torch; the losses live in ``harnessrl.algorithms.losses``,
imported explicitly by the trainer.
"""

from harnessrl.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    RolloutAdvantages,
    assign_advantages,
    dr_grpo_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    rollout_advantages,
)
from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.algorithms.packing import StepTotals, pack_micro_batches, step_totals

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AlgorithmConfig",
    "RolloutAdvantages",
    "StepTotals",
    "assign_advantages",
    "dr_grpo_advantages",
    "grpo_advantages",
    "pack_micro_batches",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "rollout_advantages",
    "step_totals",
]
