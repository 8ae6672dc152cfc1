"""One optimizer step, the same code for one process and for N torchrun ranks (as nanochat does).

``train_step`` works on a ``Learner`` (the model, its optimizer and LR schedule, the KL reference,
the policy's config) and takes a ``Ranks`` object for what differs between one process and N;
``OneProcess`` is the identity, ``distributed.ShardedRanks`` the torchrun one. Per step:

1. Step normalizers (``step_totals``) from *all* samples, so each rank's loss is its share of the
   global loss; ``Ranks.share`` keeps this rank's rollouts (all of them in one process).
2. Micro-batches of that share (``micro_batches``): shared-prefix rows (``prefix_tree``), or
   bounded packed rows (``packed_rows``) when sharing is off.
3. ``Ranks.rounds``: as many forward/backward rounds as the busiest rank has micro-batches (each
   forward of a sharded layer is a collective); a rank past its last micro-batch runs an idle round
   (a two-token batch whose loss is multiplied by 0). ``Ranks.sync_gradients`` is on for the last
   round only, so gradients are reduced once.
4. Per round, forwards (``trainer/forward.py``) go through ``Ranks.forward`` (the FSDP root on
   torchrun): with ``kl_coef > 0`` first the frozen reference model's log-probs (no grad), then the
   policy's; then the loss (``micro_batch_loss``) and its backward.
5. Gradient clip, optimizer and LR scheduler step (``NonFiniteStep``, nothing changed, when the
   step's loss or gradient norm is NaN or infinite; a step with no loss token steps only the LR
   scheduler: the schedule follows the step count); then the gradients are dropped
   (``zero_grad(set_to_none=True)``), so the ``4 P`` bytes they hold are not kept between steps,
   through the rollouts and held-out evaluations, while nothing reads them. The metrics' sums are one float64 vector per rank
   (``StepSums``, laid out by ``algorithms.losses.LOSS_METRICS``); ``Ranks.gather`` stacks every
   rank's in one collective, and the step's metrics are their sums (maxima for ``*_max``), identical
   on every rank.

Metrics (``policy/*``, docs/metrics.md): token means over the step's loss tokens. ``policy/entropy``
is the entropy of the tempered policy at each trained token, computed without grad from the logits
the policy's forward already holds (``algorithms.losses.token_entropy``, in chunks of rows);
``policy/sampled_nll`` is the mean negative log-prob of the sampled tokens, what was logged as
``entropy`` before (an estimate of the entropy only where the tokens were sampled from this very
distribution: the gap between the two is off-policyness).

The proximal policy of the PPO ratio is ``algorithm.proximal``: the engine's behaviour log-probs, or
the trainer's own (its log-probs detached, free within one optimizer step), in which case the
engine/trainer mismatch is corrected by the truncated importance weight
``min(exp(old - behaviour), tis_cap)`` (``algorithms.losses``).

Packed rows: samples are packed into rows of at most ``row_tokens`` tokens (first-fit decreasing)
with ``position_ids`` restarting per sample and no attention mask; transformers builds a
block-diagonal causal mask from the position ids, so no token attends across samples (checked by
``tests/trainer/test_policy.py``). Rows are bounded because attention over a packed row costs
row-length squared: one 3,000-token row of 32 short samples did ~30x the attention work of 32
separate rows and made the step slower than TRL's padded batch. Rows are padded to the longest row,
which wastes little since rows are filled close to ``row_tokens``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.algorithms.losses import LOSS_METRICS, MicroBatch, collate, micro_batch_loss
from harnessrl.algorithms.packing import StepTotals, pack_micro_batches, step_totals
from harnessrl.errors import ConfigError, HarnessRLError
from harnessrl.trainer import allocator
from harnessrl.trainer.config import PolicyConfig
from harnessrl.trainer.forward import TokenLogprobs, prefix_logprobs, sequence_logprobs
from harnessrl.trainer.prefix_tree import PrefixBatch, prefix_batch, prefix_micro_batches
from harnessrl.trajectory import Sample


@dataclass(frozen=True)
class Learner:
    """What one optimizer step works on (``TrainablePolicy.learner``)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    config: PolicyConfig  # micro-batch layout (row_tokens, share_prefixes), grad_clip
    device: torch.device
    autocast: str = "none"  # resolved: "bf16" or "none"
    # the KL penalty's frozen reference model (LoRA: ``model`` itself, its adapters off)
    reference: torch.nn.Module | None = None


# -- what differs between one process and N ranks ----------------------------------------------------
class Ranks(Protocol):
    """The reducer of a step: how this process takes part in it."""

    def share(self, samples: list[Sample]) -> list[Sample]:
        """This rank's samples (whole rollouts)."""
        ...

    def rounds(self, count: int) -> int:
        """Forward/backward rounds every rank runs, given this rank's micro-batch ``count``."""
        ...

    def sync_gradients(self, on: bool) -> None:
        """Whether the coming backward reduces gradients over ranks (the last round's does)."""
        ...

    def forward(
        self, fn: Callable[..., TokenLogprobs], *args: Any, reference: bool = False, **kwargs: Any
    ) -> TokenLogprobs:
        """``fn(*args, **kwargs)``, through the policy's (or, with ``reference``, the reference
        model's) sharding root where there is one."""
        ...

    def gather(self, values_L: torch.Tensor) -> torch.Tensor:
        """Every rank's ``values_L`` (a float64 vector), stacked in rank order: (world, L)."""
        ...

    def metrics(self) -> dict[str, float]:
        """Metrics this way of running adds to the step's."""
        ...


class OneProcess:
    """The identity reducer: one process holds the whole step."""

    def share(self, samples: list[Sample]) -> list[Sample]:
        return samples

    def rounds(self, count: int) -> int:
        return count

    def sync_gradients(self, on: bool) -> None:
        pass

    def forward(
        self, fn: Callable[..., TokenLogprobs], *args: Any, reference: bool = False, **kwargs: Any
    ) -> TokenLogprobs:
        return fn(*args, **kwargs)

    def gather(self, values_L: torch.Tensor) -> torch.Tensor:
        return values_L[None]

    def metrics(self) -> dict[str, float]:
        return {}


# -- micro-batches --------------------------------------------------------------------------------------
def packed_rows(samples: list[Sample], totals: StepTotals, row_tokens: int) -> MicroBatch:
    """One micro-batch as several packed rows of at most ``max(row_tokens, longest sample)`` tokens.

    Padding (to the longest row) has loss mask 0 and its own restarting positions, so it forms its
    own attention block and contributes nothing.
    """
    capacity = max(row_tokens, max(len(s) for s in samples))
    rows = pack_micro_batches(samples, capacity)
    parts = [collate(row, totals, packed=True) for row in rows]
    T = max(p.input_ids_B_T.shape[1] for p in parts)

    def pad(t: torch.Tensor, positions: bool = False) -> torch.Tensor:
        extra = T - t.shape[1]
        if extra == 0:
            return t
        fill = (
            torch.arange(extra, dtype=t.dtype)[None] if positions else torch.zeros((1, extra), dtype=t.dtype)
        )
        return torch.cat([t, fill], dim=1)

    return MicroBatch(
        input_ids_B_T=torch.cat([pad(p.input_ids_B_T) for p in parts]),
        position_ids_B_T=torch.cat([pad(p.position_ids_B_T, positions=True) for p in parts]),
        loss_mask_B_T=torch.cat([pad(p.loss_mask_B_T) for p in parts]),
        behaviour_logprobs_B_T=torch.cat([pad(p.behaviour_logprobs_B_T) for p in parts]),
        advantages_B_T=torch.cat([pad(p.advantages_B_T) for p in parts]),
        rollout_index_B_T=torch.cat([pad(p.rollout_index_B_T) for p in parts]),
        sample_index_B_T=torch.cat([pad(p.sample_index_B_T) for p in parts]),
    )


def micro_batches(
    samples: list[Sample],
    totals: StepTotals,
    micro_batch_tokens: int,
    *,
    share_prefixes: bool,
    row_tokens: int,
) -> list[MicroBatch | PrefixBatch]:
    """Shared-prefix micro-batches (``prefix_tree``), or bounded packed rows when sharing is off."""
    if not samples:
        return []
    if share_prefixes:
        return [
            prefix_batch(rows, totals)
            for rows in prefix_micro_batches(samples, micro_batch_tokens, row_tokens)
        ]
    return [
        packed_rows(micro, totals, row_tokens) for micro in pack_micro_batches(samples, micro_batch_tokens)
    ]


def idle_batch() -> MicroBatch:
    """Two tokens, the second "trained" so the selective LM head runs as on a real batch."""
    zeros = torch.zeros((1, 2))
    return MicroBatch(
        input_ids_B_T=torch.zeros((1, 2), dtype=torch.long),
        position_ids_B_T=torch.arange(2)[None],
        loss_mask_B_T=torch.tensor([[False, True]]),
        behaviour_logprobs_B_T=zeros,
        advantages_B_T=zeros,
        rollout_index_B_T=torch.zeros((1, 2), dtype=torch.long),
        sample_index_B_T=torch.zeros((1, 2), dtype=torch.long),
    )


def to_device(batch: Any, device: torch.device) -> Any:
    """A micro-batch (``MicroBatch`` or ``PrefixBatch``, nested) with its tensors on ``device``."""
    if device.type == "cpu":
        return batch
    moved = {}
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, torch.Tensor):
            moved[f.name] = value.to(device)
        elif dataclasses.is_dataclass(value):
            moved[f.name] = to_device(value, device)
    return dataclasses.replace(batch, **moved)


def micro_logprobs(
    learner: Learner,
    micro: MicroBatch | PrefixBatch,
    temperature: float,
    ranks: Ranks,
    *,
    reference: bool = False,
) -> tuple[TokenLogprobs, MicroBatch]:
    """One micro-batch's trained-token log-probs (policy or reference) with their entropies (the
    policy's only, detached), and the micro-batch's loss entries."""
    model = learner.reference if reference else learner.model
    options = {"with_entropy": not reference, "autocast": learner.autocast}
    # LoRA: the reference is the policy's own base weights, its adapters switched off (policy.py).
    base = model.disable_adapter() if reference and model is learner.model else contextlib.nullcontext()
    with base:
        if isinstance(micro, PrefixBatch):
            out = ranks.forward(prefix_logprobs, model, micro, temperature, reference=reference, **options)
            return out, micro.entries
        out = ranks.forward(
            sequence_logprobs,
            model,
            micro.input_ids_B_T,
            micro.position_ids_B_T,
            temperature,
            micro.loss_mask_B_T,
            reference=reference,
            **options,
        )
    return out, micro


# -- the step's metric sums ---------------------------------------------------------------------------
#: Positions in a rank's sums vector before the per-metric ones.
_LOSS, _ENTROPY, _NLL, _TOKENS = range(4)
_MEANS = tuple(name for name in LOSS_METRICS if name != "loss_tokens" and not name.endswith("_max"))
_MAXIMA = tuple(name for name in LOSS_METRICS if name.endswith("_max"))


class StepSums:
    """One rank's sums over its micro-batches, as one float64 vector: loss, entropy, sampled NLL,
    forward tokens, then for each mean metric of ``LOSS_METRICS`` its loss-token-weighted sum and
    its weight, then each maximum (-inf where none was seen)."""

    def __init__(self) -> None:
        self.totals = [0.0, 0.0, 0.0, 0.0]
        self.sums = dict.fromkeys(_MEANS, 0.0)
        self.weights = dict.fromkeys(_MEANS, 0.0)
        self.maxima = dict.fromkeys(_MAXIMA, -math.inf)

    def add(
        self,
        loss_metrics: Mapping[str, float],
        n: int,
        *,
        loss: float,
        entropy: float,
        nll: float,
        tokens: int,
    ) -> None:
        self.totals[_LOSS] += loss
        self.totals[_ENTROPY] += entropy
        self.totals[_NLL] += nll
        self.totals[_TOKENS] += tokens
        for key, value in loss_metrics.items():
            if key == "loss_tokens":  # a count, not a per-token mean: the step's is policy/loss_tokens
                continue
            if key in self.maxima:
                self.maxima[key] = max(self.maxima[key], float(value))
            else:
                self.sums[key] += float(value) * n  # KeyError: a metric missing from LOSS_METRICS
                self.weights[key] += n

    def vector(self) -> torch.Tensor:
        values = [*self.totals, *self.sums.values(), *self.weights.values(), *self.maxima.values()]
        return torch.tensor(values, dtype=torch.float64)


def reduce_sums(parts_W_L: torch.Tensor, loss_tokens: int) -> dict[str, float]:
    """The step's metrics from every rank's ``StepSums.vector()`` (rows in rank order)."""
    k = len(_MEANS)
    summed = parts_W_L[:, : 4 + 2 * k].sum(0).tolist()
    maxima = parts_W_L[:, 4 + 2 * k :].amax(0).tolist()
    sums, weights = summed[4 : 4 + k], summed[4 + k :]
    metrics = {f"policy/{key}": s / w for key, s, w in zip(_MEANS, sums, weights, strict=True) if w}
    metrics.update({f"policy/{key}": m for key, m in zip(_MAXIMA, maxima, strict=True) if m != -math.inf})
    denominator = max(1, loss_tokens)
    metrics.update(
        {
            "policy/loss": summed[_LOSS],
            "policy/entropy": summed[_ENTROPY] / denominator,
            "policy/sampled_nll": summed[_NLL] / denominator,
            "policy/forward_tokens": summed[_TOKENS],
        }
    )
    return metrics


# -- the step -----------------------------------------------------------------------------------------
class NonFiniteStep(HarnessRLError):
    """A step whose loss or gradient is NaN or infinite: refused before the optimizer step."""


def train_step(
    learner: Learner,
    samples: list[Sample],
    algorithm: AlgorithmConfig,
    *,
    temperature: float,
    micro_batch_tokens: int,
    ranks: Ranks | None = None,
) -> dict[str, float]:
    """One optimizer step over all ``samples`` (the whole step, identical on every rank)."""
    ranks = ranks or OneProcess()
    totals = step_totals(samples)  # global normalizers: every rank sees the whole step
    if totals.num_loss_tokens == 0:
        # No update, but the step counts (it is a policy version, and trainer.steps counts it): the
        # LR schedule advances as on any step, so step N always trains at the schedule's rate for N.
        # Left behind, every skip shifted the whole schedule one step later (a warmup one step
        # longer, a decay that never reached its end) and a resumed run kept the shift.
        with warnings.catch_warnings():
            # torch warns of a scheduler step before the optimizer's first: intended here
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
            learner.scheduler.step()
        return {"policy/loss": 0.0, "policy/skipped": 1.0}
    with_reference = algorithm.kl_coef > 0
    if with_reference and learner.reference is None:
        raise ConfigError(
            "algorithm.kl_coef > 0 needs a reference model: build the policy with reference_dir "
            "(TrainablePolicy.from_config does when kl_coef > 0)"
        )
    local = ranks.share(samples)
    micros = micro_batches(
        local,
        totals,
        micro_batch_tokens,
        share_prefixes=learner.config.share_prefixes,
        row_tokens=learner.config.row_tokens,
    )
    rounds = ranks.rounds(len(micros))

    learner.optimizer.zero_grad(set_to_none=True)
    sums = StepSums()
    for i in range(rounds):
        # Gradients are reduced once, after the last round; before that they accumulate locally.
        ranks.sync_gradients(i == rounds - 1)
        idle = i >= len(micros)
        micro = to_device(idle_batch() if idle else micros[i], learner.device)
        ref_logprobs = None
        if with_reference:
            with torch.no_grad():
                ref_logprobs = micro_logprobs(learner, micro, temperature, ranks, reference=True)[0].logprobs
        (logprobs, entropy), batch = micro_logprobs(learner, micro, temperature, ranks)
        if idle:  # this rank has no work left but must join the collectives
            (logprobs.sum() * 0.0).backward()
            continue
        # proximal "trainer": the old policy is the trainer's own, as it is before this step's update.
        old_logprobs = logprobs.detach() if algorithm.proximal == "trainer" else None
        out = micro_batch_loss(
            logprobs, batch, totals, algorithm, old_logprobs_B_T=old_logprobs, ref_logprobs_B_T=ref_logprobs
        )
        out.loss.backward()
        if learner.device.type == "cpu":
            allocator.release()  # what this micro-batch freed in the heap, back before the next one
        mask = batch.loss_mask_B_T
        sums.add(
            out.metrics,
            int(mask.sum()),
            loss=float(out.loss.detach()),
            entropy=float((entropy * mask).sum()) if entropy is not None else 0.0,
            nll=float(-(logprobs.detach() * mask).sum()),
            tokens=micro.computed_tokens
            if isinstance(micro, PrefixBatch)
            else int(batch.input_ids_B_T.numel()),
        )
    # The norm before clipping, reported with clipping off too (an infinite limit leaves the
    # gradients as they are). On sharded (DTensor) parameters it is the full gradient's (a collective).
    clip = learner.config.optimizer.grad_clip or math.inf
    norm = torch.nn.utils.clip_grad_norm_(learner.model.parameters(), clip)
    grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    # Gathered before the update (a collective every rank enters): the step's loss over all ranks.
    metrics = reduce_sums(ranks.gather(sums.vector()), totals.num_loss_tokens)
    if not (math.isfinite(grad_norm) and math.isfinite(metrics["policy/loss"])):
        # A NaN gradient made every weight NaN (and the engine then served them); a NaN loss with a
        # finite gradient trained its token on nothing. Both values are the whole step's, the same
        # on every rank, so every rank refuses together. Nothing changed: not the weights, the
        # optimizer state or the LR schedule.
        learner.optimizer.zero_grad(set_to_none=True)
        raise NonFiniteStep(
            f"the step's loss is {metrics['policy/loss']} and its gradient norm {grad_norm}: not applied "
            "(weights, optimizer and LR schedule unchanged). A NaN or infinity in the policy's "
            "log-probs, the samples' behaviour log-probs or their advantages"
        )
    lr = learner.scheduler.get_last_lr()[0]  # this update's rate; scheduler.step() then sets the next one
    learner.optimizer.step()
    learner.scheduler.step()
    # Nothing reads the gradients until the next step's backward writes new ones: free them now
    # rather than at the next step's start (for SmolLM2-135M in fp32, 0.54 GB held otherwise).
    learner.optimizer.zero_grad(set_to_none=True)

    metrics.update(
        {
            "policy/grad_norm": grad_norm,
            "policy/lr": lr,
            "policy/loss_tokens": float(totals.num_loss_tokens),
            "policy/samples": float(len(samples)),
            **ranks.metrics(),
        }
    )
    return metrics
