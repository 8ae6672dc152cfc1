"""The policy seam: what the training run, its loop and its fleets need from the trainer's policy
(``Policy``), and the part of it a fleet publishes (``Weights``).

Three classes implement ``Policy`` in full: ``policy.TrainablePolicy`` (one process),
``distributed.ShardedPolicy`` (one torchrun rank of an FSDP-sharded policy; every method is a
collective) and ``torchrun.LeaderPolicy`` (rank 0's handle, which has every rank run each call).
``tests/trainer/test_policy_protocol.py`` checks that each has every method with the protocol's
signature, so a method the loop or a fleet starts calling cannot be missing on one of them (the
torchrun policies once lacked ``response_logprobs``, and torchrun with remote servers failed).
No torch here: the loop and the fleets import this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from harnessrl.algorithms.config import AlgorithmConfig
    from harnessrl.trajectory import Sample


class Weights(Protocol):
    """What a fleet needs to publish a policy's weights to its engines."""

    def engine_state_dict(self) -> dict[str, Any]:
        """Full weights under the base model's names (in-process engines load these)."""
        ...

    def save_checkpoint(self, folder: Path, *, with_optimizer: bool = True) -> Path:
        """A Hugging Face folder (engine servers and ``--resume`` load these), with the optimizer
        and LR schedule state unless ``with_optimizer`` is false."""
        ...

    def save_adapter(self, folder: Path) -> bool:
        """The LoRA adapter alone, in PEFT's format, into ``folder`` (engine servers load it as a
        new adapter); False, writing nothing, for a policy without ``[trainer.lora]``."""
        ...


@runtime_checkable
class Policy(Weights, Protocol):
    def train_step(
        self,
        samples: list[Sample],
        algorithm: AlgorithmConfig,
        *,
        temperature: float,
        micro_batch_tokens: int,
    ) -> dict[str, float]:
        """One optimizer step over all ``samples`` (every sample of every rollout of the step);
        returns the step's ``policy/*`` metrics."""
        ...

    def response_logprobs(
        self, prompt_ids: list[int], response_ids: list[int], temperature: float = 1.0
    ) -> list[float]:
        """log p(response token | prompt, earlier response tokens) at ``temperature``: what an
        engine serving these weights reports (the served-weights check compares the two)."""
        ...

    def load_trainer_state(self, folder: Path) -> None:
        """The optimizer and LR schedule state of a checkpoint ``save_checkpoint`` wrote."""
        ...
