"""One optimizer step, the same code for one process and for N torchrun ranks (as nanochat does).

``train_step`` takes a ``Ranks`` object for what differs between the two; ``OneProcess`` is the
identity, ``distributed.ShardedRanks`` the torchrun one. Per step:

1. Step normalizers (``step_totals``) from *all* samples, so each rank's loss is its share of the
   global loss; ``Ranks.share`` keeps this rank's rollouts (all of them in one process).
2. Micro-batches of that share (``micro_batches``): shared-prefix rows (``prefix_tree``), or
   bounded packed rows (``packed_rows``) when sharing is off.
3. ``Ranks.rounds``: as many forward/backward rounds as the busiest rank has micro-batches (each
   forward of a sharded layer is a collective); a rank past its last micro-batch runs an idle round
   (a two-token batch whose loss is multiplied by 0). ``Ranks.sync_gradients`` is on for the last
   round only, so gradients are reduced once.
4. Per round, forwards go through ``Ranks.forward`` (the FSDP root on torchrun): with ``kl_coef > 0``
   first the frozen reference model's log-probs (no grad), then the policy's; then the loss
   (``micro_batch_loss``) and its backward.
5. Gradient clip, optimizer and LR scheduler step; ``Ranks.gather`` collects every rank's sums, so
   the metrics are those of the whole step (identical on every rank).

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

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.algorithms.losses import MicroBatch, collate, micro_batch_loss
from harnessrl.algorithms.packing import StepTotals, pack_micro_batches, step_totals
from harnessrl.errors import ConfigError
from harnessrl.trainer.prefix_tree import PrefixBatch, prefix_batch, prefix_micro_batches
from harnessrl.trajectory import Sample

if TYPE_CHECKING:
    from harnessrl.trainer.policy import TrainablePolicy


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

    def forward(self, fn: Callable[..., torch.Tensor], *args: Any, reference: bool = False, **kwargs: Any):
        """``fn(*args, **kwargs)``, through the policy's (or, with ``reference``, the reference
        model's) sharding root where there is one."""
        ...

    def gather(self, part: Any) -> list[Any]:
        """Every rank's ``part``, in rank order."""
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

    def forward(self, fn: Callable[..., torch.Tensor], *args: Any, reference: bool = False, **kwargs: Any):
        return fn(*args, **kwargs)

    def gather(self, part: Any) -> list[Any]:
        return [part]

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


def _logprobs(
    policy: TrainablePolicy,
    micro: MicroBatch | PrefixBatch,
    temperature: float,
    ranks: Ranks,
    *,
    reference: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, MicroBatch]:
    """One micro-batch's trained-token log-probs (policy or reference), their entropies (the
    policy's only, detached) and its loss entries."""
    model = policy.reference if reference else policy.model
    with_entropy = not reference
    if isinstance(micro, PrefixBatch):
        out = ranks.forward(
            policy.prefix_logprobs,
            micro,
            temperature,
            model=model,
            with_entropy=with_entropy,
            reference=reference,
        )
        batch = micro.entries
    else:
        out = ranks.forward(
            policy.logprobs,
            micro.input_ids_B_T,
            micro.position_ids_B_T,
            temperature,
            micro.loss_mask_B_T,
            model=model,
            with_entropy=with_entropy,
            reference=reference,
        )
        batch = micro
    logprobs, entropy = out if with_entropy else (out, None)
    return logprobs, entropy, batch


# -- the step -----------------------------------------------------------------------------------------
def train_step(
    policy: TrainablePolicy,
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
        return {"policy/loss": 0.0, "policy/skipped": 1.0}
    with_reference = algorithm.kl_coef > 0
    if with_reference and policy.reference is None:
        raise ConfigError(
            "algorithm.kl_coef > 0 needs a reference model: build the policy with reference_dir "
            "(TrainablePolicy.from_config does when kl_coef > 0)"
        )
    local = ranks.share(samples)
    micros = micro_batches(
        local, totals, micro_batch_tokens, share_prefixes=policy.share_prefixes, row_tokens=policy.row_tokens
    )
    rounds = ranks.rounds(len(micros))

    policy.optimizer.zero_grad(set_to_none=True)
    sums: dict[str, float] = {}  # per-token means, weighted by each micro-batch's loss tokens
    weights: dict[str, float] = {}
    maxima: dict[str, float] = {}  # the "_max" metrics: the largest over the step, not a mean
    loss_total = entropy_sum = nll_sum = 0.0
    tokens = 0
    for i in range(rounds):
        # Gradients are reduced once, after the last round; before that they accumulate locally.
        ranks.sync_gradients(i == rounds - 1)
        idle = i >= len(micros)
        micro = to_device(idle_batch() if idle else micros[i], policy.device)
        ref_logprobs = None
        if with_reference:
            with torch.no_grad():
                ref_logprobs, _, _ = _logprobs(policy, micro, temperature, ranks, reference=True)
        logprobs, entropy, batch = _logprobs(policy, micro, temperature, ranks)
        if idle:  # this rank has no work left but must join the collectives
            (logprobs.sum() * 0.0).backward()
            continue
        # proximal "trainer": the old policy is the trainer's own, as it is before this step's update.
        old_logprobs = logprobs.detach() if algorithm.proximal == "trainer" else None
        out = micro_batch_loss(
            logprobs, batch, totals, algorithm, old_logprobs_B_T=old_logprobs, ref_logprobs_B_T=ref_logprobs
        )
        out.loss.backward()
        loss_total += float(out.loss.detach())
        n = int(batch.loss_mask_B_T.sum())
        tokens += (
            micro.computed_tokens if isinstance(micro, PrefixBatch) else int(batch.input_ids_B_T.numel())
        )
        assert entropy is not None
        entropy_sum += float((entropy * batch.loss_mask_B_T).sum())
        nll_sum += float(-(logprobs.detach() * batch.loss_mask_B_T).sum())
        for key, value in out.metrics.items():
            if key == "loss_tokens":  # a count, not a per-token mean: the step's is policy/loss_tokens
                continue
            if key.endswith("_max"):
                maxima[key] = max(maxima.get(key, -math.inf), float(value))
                continue
            sums[key] = sums.get(key, 0.0) + float(value) * n
            weights[key] = weights.get(key, 0.0) + n
    grad_norm = 0.0
    if policy.grad_clip:
        # On sharded (DTensor) parameters this is the norm of the full gradient (a collective).
        norm = torch.nn.utils.clip_grad_norm_(policy.model.parameters(), policy.grad_clip)
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    lr = policy.scheduler.get_last_lr()[0]  # this update's rate; scheduler.step() then sets the next one
    policy.optimizer.step()
    policy.scheduler.step()

    parts = ranks.gather((loss_total, entropy_sum, nll_sum, tokens, sums, weights, maxima))
    all_sums: dict[str, float] = {}
    all_weights: dict[str, float] = {}
    all_maxima: dict[str, float] = {}
    for *_, s, w, m in parts:
        for key in s:
            all_sums[key] = all_sums.get(key, 0.0) + s[key]
            all_weights[key] = all_weights.get(key, 0.0) + w[key]
        for key in m:
            all_maxima[key] = max(all_maxima.get(key, -math.inf), m[key])
    loss_tokens = max(1, totals.num_loss_tokens)
    metrics = {f"policy/{k}": all_sums[k] / all_weights[k] for k in all_sums if all_weights[k]}
    metrics.update({f"policy/{k}": v for k, v in all_maxima.items()})
    metrics.update(
        {
            "policy/loss": sum(p[0] for p in parts),
            "policy/entropy": sum(p[1] for p in parts) / loss_tokens,
            "policy/sampled_nll": sum(p[2] for p in parts) / loss_tokens,
            "policy/grad_norm": grad_norm,
            "policy/lr": lr,
            "policy/forward_tokens": float(sum(p[3] for p in parts)),
            "policy/loss_tokens": float(totals.num_loss_tokens),
            "policy/samples": float(len(samples)),
            **ranks.metrics(),
        }
    )
    return metrics
