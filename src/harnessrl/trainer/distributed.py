"""Data-parallel training over ``torchrun`` with FSDP2: one optimizer step spread over N ranks that
gives the same loss and the same gradients as the one-process step. Both run the same
``train_step.train_step``; ``ShardedRanks`` is what makes it a step over N ranks.

How a step is split:

- **Every rank sees the whole step.** The step's normalizers (``step_totals``: rollouts, loss tokens
  per rollout, samples) come from the full sample list, so each rank's loss is its share of the
  *global* loss and the ranks' losses sum to the one-process loss exactly (up to float order).
- **Rollouts stay whole.** ``assign_rollouts`` gives every rollout, with all its samples, to one rank,
  longest-processing-time first on token counts (deterministic: every rank computes the same
  assignment without talking to the others).
- **Gradients are summed, not averaged.** FSDP's reduce-scatter divides by the world size by default
  (right for a loss averaged per rank, wrong here where each rank's loss is already a share of the
  global loss); ``shard_model`` sets a divide factor of 1 with a plain SUM reduction.
- **Same number of forward passes on every rank.** Each forward/backward of a sharded layer is a
  collective, so a rank with fewer micro-batches runs idle ones (a two-token batch whose loss is
  multiplied by 0) until all ranks have run as many as the busiest one (an all-reduce MAX of the
  micro-batch counts).

Sharding: every decoder layer is its own FSDP unit; a small root module (``ShardedPolicy.root``)
holds the rest (embeddings, final norm, LM head, tied or not) and runs ``forward.sequence_logprobs``
or ``prefix_logprobs`` inside its forward, so the one-process micro-batching and forward code
(shared-prefix rows or packed rows, selective LM head) run unchanged on each rank's share. The KL
penalty's reference model (``algorithm.kl_coef > 0``) is sharded the same way, with its own root;
with LoRA the reference is the policy's own base weights (adapters switched off), so the policy's
root serves both. LoRA's base weights are frozen and sharded with their layer like the rest; only
the adapters have gradients and optimizer state (FSDP2 takes a unit with frozen and trainable
parameters).
The step's metrics are reduced in one collective: every rank's sums as one float64 vector,
gathered (``ShardedRanks.gather``).

Full weights for the engine and checkpoints are gathered on rank 0 (with LoRA the adapter too, and
the engine gets the adapted layers with the adapters merged, as from one process). ``harnessrl.trainer.torchrun``
runs a whole ``harnessrl train`` run this way (rank 0 leads, the other ranks follow).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.errors import ConfigError
from harnessrl.trainer.checkpoint import TRAINER_STATE_FILE, CheckpointUnreadable, read_trainer_state
from harnessrl.trainer.forward import TokenLogprobs, sequence_logprobs
from harnessrl.trainer.lora import merged_from_state, save_adapter_state
from harnessrl.trainer.policy import (
    TrainablePolicy,
    apply_optimizer_config,
    evaluating,
    rng_state,
    set_rng_state,
)
from harnessrl.trainer.train_step import train_step
from harnessrl.trajectory import Sample

#: How long the other ranks wait for rank 0's next command: rank 0 may spend a long time collecting
#: rollouts between steps, far longer than a collective's usual timeout.
COMMAND_TIMEOUT = timedelta(days=7)


# -- assignment of rollouts to ranks (pure) -------------------------------------------------------------
def assign_rollouts(samples: Sequence[Sample], world_size: int) -> list[list[Sample]]:
    """Split a step's samples over ``world_size`` ranks, every rollout whole on one rank.

    Greedy longest-processing-time on tokens (prompt + response, what a forward pass costs): rollouts
    by decreasing token count (ties: first appearance), each to the least-loaded rank (ties: lowest
    rank). So the busiest rank holds at most one rollout's tokens more than the least busy. Each
    rank's samples keep their order in ``samples``. Deterministic, so every rank computes the same
    split on its own.
    """
    if world_size < 1:
        raise ConfigError(f"world_size must be at least 1, got {world_size}")
    tokens: dict[str, int] = {}
    for s in samples:
        tokens[s.rollout_id] = tokens.get(s.rollout_id, 0) + len(s)
    order = sorted(tokens, key=lambda rid: -tokens[rid])  # sorted() is stable: ties keep first appearance
    load = [0] * world_size
    rank_of: dict[str, int] = {}
    for rid in order:
        rank = min(range(world_size), key=lambda r: (load[r], r))
        rank_of[rid] = rank
        load[rank] += tokens[rid]
    shards: list[list[Sample]] = [[] for _ in range(world_size)]
    for s in samples:
        shards[rank_of[s.rollout_id]].append(s)
    return shards


# -- the process group --------------------------------------------------------------------------------
@dataclass(frozen=True)
class DistributedContext:
    """This process's place in the torchrun world. ``control`` is a gloo group with a long timeout
    for commands and small Python objects (metrics); the default group carries the tensors."""

    rank: int
    world_size: int
    device: torch.device
    mesh: DeviceMesh
    control: Any  # dist.ProcessGroup

    @property
    def is_leader(self) -> bool:
        return self.rank == 0


def init_distributed() -> DistributedContext:
    """Join the torchrun world (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` set by
    torchrun): nccl with one GPU per rank when CUDA is there, gloo on CPU."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k not in os.environ]
    if missing:
        raise ConfigError(
            f"not started by torchrun ({', '.join(missing)} unset): "
            "torchrun --nproc_per_node N -m harnessrl.trainer.torchrun CONFIG"
        )
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend)
    control = dist.new_group(backend="gloo", timeout=COMMAND_TIMEOUT)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    return DistributedContext(dist.get_rank(), dist.get_world_size(), device, mesh, control)


# -- the sharded policy -----------------------------------------------------------------------------
class _Root(torch.nn.Module):
    """FSDP root: runs a forward function (``forward.sequence_logprobs``) inside its forward, so FSDP
    gathers the parameters the layers do not own (embeddings, norm, LM head) around it and reduces
    their gradients after backward, whichever submodules the function uses directly."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, fn: Callable[..., TokenLogprobs], *args: Any, **kwargs: Any) -> TokenLogprobs:
        out = fn(*args, **kwargs)
        # FSDP hooks its pre-backward on the outputs; an in-place op on a view would bypass it.
        return TokenLogprobs(*(t.clone() if t is not None and t._base is not None else t for t in out))


def shard_model(model: torch.nn.Module, mesh: DeviceMesh) -> torch.nn.Module:
    """Apply FSDP2 in place: one unit per decoder layer, the rest in a root; return the root."""
    layers = getattr(model.get_decoder(), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise ConfigError(f"cannot shard {type(model).__name__}: no decoder.layers to wrap")
    units = [fully_shard(layer, mesh=mesh) for layer in layers]
    root = fully_shard(_Root(model), mesh=mesh)
    for unit in [*units, root]:
        # Each rank's loss is its share of the global loss: sum the gradients (FSDP's default divides
        # by the world size). A plain SUM also avoids PREMUL_SUM, which gloo lacks.
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)
    return root


class ShardedPolicy:
    """A ``TrainablePolicy`` whose model is sharded over the torchrun world. Every method is a
    collective: all ranks call it, in the same order, with the same arguments."""

    def __init__(self, ctx: DistributedContext, build: Callable[..., TrainablePolicy]):
        self.ctx = ctx
        roots: list[torch.nn.Module] = []
        self.policy = build(prepare_model=lambda model: roots.append(shard_model(model, ctx.mesh)))
        [self.root] = roots  # build() shards the model exactly once, before making its optimizer
        reference = self.policy.reference  # the KL penalty's, sharded like the policy
        if reference is None:
            reference_root = None
        elif reference is self.policy.model:  # LoRA: the policy's own base weights, adapters off
            reference_root = self.root
        else:
            reference_root = shard_model(reference, ctx.mesh)
        self.ranks = ShardedRanks(ctx, self.root, reference_root)

    def train_step(
        self,
        samples: list[Sample],
        algorithm: AlgorithmConfig,
        *,
        temperature: float,
        micro_batch_tokens: int,
    ) -> dict[str, float]:
        """One optimizer step over all ``samples`` (the whole step, identical on every rank), each
        rank training on its ``assign_rollouts`` share. Returns the one-process step's metrics,
        aggregated over ranks (identical on every rank), plus ``policy/world_size``."""
        return train_step(
            self.policy.learner,
            samples,
            algorithm,
            temperature=temperature,
            micro_batch_tokens=micro_batch_tokens,
            ranks=self.ranks,
        )

    @torch.no_grad()
    def response_logprobs(
        self, prompt_ids: list[int], response_ids: list[int], temperature: float = 1.0
    ) -> list[float]:
        """``TrainablePolicy.response_logprobs`` through the sharded model (every rank computes it)."""
        device = self.policy.device
        ids = torch.tensor([prompt_ids + response_ids], device=device)
        positions = torch.arange(ids.shape[1], device=device)[None, :]
        with evaluating(self.policy.model):
            out = self.ranks.forward(
                sequence_logprobs,
                self.policy.model,
                ids,
                positions,
                temperature,
                autocast=self.policy.learner.autocast,
            )
        return out.logprobs[0, len(prompt_ids) :].tolist()

    def _full_state(self) -> dict[str, torch.Tensor]:
        """The model's whole state dict, gathered on CPU on rank 0 (an empty dict elsewhere)."""
        return get_model_state_dict(
            self.policy.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def engine_state_dict(self) -> dict[str, torch.Tensor]:
        """What the one-process policy gives an engine, on rank 0 (an empty dict elsewhere): full
        weights under the model's own names; with LoRA the adapted layers' weights, adapters merged."""
        state = self._full_state()
        if self.policy.config.lora is None or not self.ctx.is_leader:
            return state
        return merged_from_state(self.policy.model, state, adapted_only=True)

    def save_adapter(self, folder: Path) -> bool:
        """The adapter in PEFT's format, written by rank 0 (as ``TrainablePolicy.save_adapter``)."""
        if self.policy.config.lora is None:
            return False
        state = self._full_state()
        with self._leader_writes():
            if self.ctx.is_leader:
                save_adapter_state(self.policy.model, state, folder)
        return True

    def save_checkpoint(self, folder: Path, *, with_optimizer: bool = True) -> Path:
        """Rank 0 writes the same folder as the one-process policy; the optimizer state is the full
        (unsharded) state dict keyed by parameter name, reloadable by any world size."""
        state = self._full_state()
        optimizer_state = (
            get_optimizer_state_dict(
                self.policy.model,
                self.policy.optimizer,
                options=StateDictOptions(full_state_dict=True, cpu_offload=True),
            )
            if with_optimizer
            else None
        )
        rank_rng = self._gather_rng() if with_optimizer else None
        with self._leader_writes():
            if self.ctx.is_leader:
                self.policy.save_checkpoint(
                    folder,
                    with_optimizer=with_optimizer,
                    state_dict=state,
                    optimizer_state=optimizer_state,
                    rank_rng=rank_rng,
                )
        return folder

    def _gather_rng(self) -> list[dict[str, torch.Tensor]] | None:
        """Every rank's generator state (``policy.rng_state``), by rank, on rank 0 (None elsewhere):
        each rank draws its own dropout masks from its own generator, and they part ways after the
        first step (each rank's share of the step has other shapes)."""
        states: list[Any] | None = [None] * self.ctx.world_size if self.ctx.is_leader else None
        mine = rng_state(self.policy.device)
        dist.gather_object(mine, states, dst=0, group=self.ctx.control)
        return states

    @contextlib.contextmanager
    def _leader_writes(self) -> Iterator[None]:
        """Rank 0 writes while the other ranks wait at a barrier; rank 0 joins it even when the
        write fails (a full disk), then raises. Skipping it left the others in the barrier, which
        then paired with rank 0's next command or its "stop": a hang (the command group's timeout
        is days)."""
        try:
            yield
        finally:
            dist.barrier(group=self.ctx.control)

    def load_trainer_state(self, folder: Path) -> None:
        """Rank 0 reads the optimizer, scheduler and generator state and broadcasts it (other ranks
        need no access to the run folder), as ``TrainablePolicy.load_trainer_state`` loads them."""
        saved = self._leader_reads_trainer_state(folder)
        set_optimizer_state_dict(
            self.policy.model,
            self.policy.optimizer,
            optim_state_dict=saved.get("optimizer", {}),
            options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
        )
        box = [(saved.get("scheduler"), saved.get("rng"), saved.get("rank_rng"))]
        dist.broadcast_object_list(box, src=0, group=self.ctx.control)
        scheduler, rng, rank_rng = box[0]
        self.policy.scheduler.load_state_dict(scheduler)
        # this run's [optimizer] settings, not the saved ones (``policy.apply_optimizer_config``)
        apply_optimizer_config(self.policy.optimizer, self.policy.scheduler, self.policy.config.optimizer)
        # The generator: resumed steps draw the dropout masks the run would have drawn. Each rank its
        # own state when the world is the one that saved it; else (another world size, a one-process
        # checkpoint) every rank rank 0's, as a fresh start seeds every rank alike. A checkpoint
        # without one keeps the freshly seeded generator (as one process does).
        if rank_rng is not None and len(rank_rng) == self.ctx.world_size:
            rng = rank_rng[self.ctx.rank]
        if rng is not None:
            set_rng_state(rng, self.policy.device)

    def _leader_reads_trainer_state(self, folder: Path) -> dict[str, Any]:
        """The checkpoint's trainer state on rank 0 (an empty dict elsewhere), checked there before
        any rank loads it: a damaged file, or a one-process run's optimizer state, is the same
        ``CheckpointUnreadable`` on every rank. Rank 0 alone failing left the other ranks in
        ``set_optimizer_state_dict``'s collectives until torchrun stopped them."""
        saved: dict[str, Any] = {}
        error: str | None = None
        if self.ctx.is_leader:
            try:
                saved = read_trainer_state(folder)
                check_by_name(saved["optimizer"], folder / TRAINER_STATE_FILE)
            except CheckpointUnreadable as exc:
                error = str(exc)
        box = [error]
        dist.broadcast_object_list(box, src=0, group=self.ctx.control)
        if box[0] is not None:
            raise CheckpointUnreadable(box[0])
        return saved


def check_by_name(optimizer_state: dict[str, Any], path: Path) -> None:
    """``optimizer_state`` is the by-name (FSDP) state ``ShardedPolicy.save_checkpoint`` writes, not a
    one-process run's (parameters by index), which the sharded optimizer cannot load."""
    # Never another error than CheckpointUnreadable: rank 0 raising alone is what this check prevents.
    groups = optimizer_state.get("param_groups")
    valid = isinstance(groups, list) and all(
        isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups
    )
    names = [p for g in groups for p in g["params"]] if valid else []
    if not valid or not all(isinstance(name, str) for name in names):
        raise CheckpointUnreadable(
            f"{path} holds no torchrun run's optimizer state (parameters by name): a one-process run's "
            "checkpoint continues with harnessrl train --resume; or delete the file to resume with the "
            "optimizer and LR schedule started afresh"
        )


# -- one data-parallel optimizer step ----------------------------------------------------------------
class ShardedRanks:
    """``train_step``'s reducer over the torchrun world (see the module docstring)."""

    def __init__(
        self, ctx: DistributedContext, root: torch.nn.Module, reference_root: torch.nn.Module | None
    ):
        self.ctx = ctx
        self.root = root
        self.reference_root = reference_root

    def share(self, samples: list[Sample]) -> list[Sample]:
        return assign_rollouts(samples, self.ctx.world_size)[self.ctx.rank]

    def rounds(self, count: int) -> int:
        counts = torch.tensor([count], device=self.ctx.device)
        dist.all_reduce(counts, op=dist.ReduceOp.MAX)
        return int(counts.item())

    def sync_gradients(self, on: bool) -> None:
        self.root.set_requires_gradient_sync(on)

    def forward(
        self, fn: Callable[..., TokenLogprobs], *args: Any, reference: bool = False, **kwargs: Any
    ) -> TokenLogprobs:
        # Through the FSDP root, which gathers what the layers do not own around the call.
        root = self.reference_root if reference else self.root
        if root is None:  # train_step refuses kl_coef > 0 without a reference before any forward
            raise ConfigError("no sharded reference model: the policy was built without reference_dir")
        return root(fn, *args, **kwargs)

    def gather(self, values_L: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(values_L, device=self.ctx.device) for _ in range(self.ctx.world_size)]
        dist.all_gather(parts, values_L.to(self.ctx.device))
        return torch.stack(parts).cpu()

    def metrics(self) -> dict[str, float]:
        return {"policy/world_size": float(self.ctx.world_size)}
