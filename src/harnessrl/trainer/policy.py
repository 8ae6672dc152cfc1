"""The trainable policy: a transformers causal LM, its optimizer step and its checkpoints.

The trainer keeps its own fp32 copy of the weights (the master copy); the engine serving rollouts
gets a copy of them after every step (``engine_state_dict``). The policy owns its settings
(``config``, a ``PolicyConfig``: ``TrainablePolicy(model_dir, **settings)``, or ``from_config`` for
a run's). Its forward pass is ``trainer.forward`` (log-probs at the engine's sampling temperature);
the optimizer step is ``trainer.train_step`` over the policy's ``learner`` (model, optimizer, LR
schedule, reference), the same code for one process and for torchrun ranks. With ``reference_dir``
(``algorithm.kl_coef > 0``) the policy also holds a frozen reference model for the KL penalty: a full
fp32 copy of those weights, never trained, in eval mode; with LoRA on the same base weights, the
policy's own model with its adapters switched off (``trainer/lora.py``), no copy.

It implements ``trainer.base.Policy``, as ``distributed.ShardedPolicy`` and ``torchrun.LeaderPolicy``
do.
"""

from __future__ import annotations

import contextlib
import math
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.errors import ConfigError
from harnessrl.hardware import resolve_autocast
from harnessrl.trainer.checkpoint import read_trainer_state
from harnessrl.trainer.config import OptimizerConfig, PolicyConfig
from harnessrl.trainer.forward import TokenLogprobs, sequence_logprobs
from harnessrl.trainer.lora import (
    ADAPTER_DIR,
    ADAPTER_LAYERS_ONLY,
    adapted_weights,
    merged_from_state,
    save_adapter_state,
    with_lora,
)
from harnessrl.trainer.train_step import Learner, train_step
from harnessrl.trajectory import Sample

if TYPE_CHECKING:
    from harnessrl.trainer.config import TrainConfig


def lr_lambda(config: OptimizerConfig, total_steps: int):
    def factor(step: int) -> float:
        if config.warmup_steps and step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        if config.schedule == "constant":
            return 1.0
        span = max(1, total_steps - config.warmup_steps)
        progress = min(1.0, (step - config.warmup_steps) / span)
        shape = 1.0 - progress if config.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * shape

    return factor


def load_model(
    model_dir: str | Path, config: PolicyConfig, adapter_dir: str | Path | None = None
) -> torch.nn.Module:
    """The fp32 model the policy trains (with LoRA adapters when ``config.lora``: fresh ones, or
    those saved in ``adapter_dir``)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.config.use_cache = False
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        checkpoint_every(model, config.gradient_checkpointing_every)
    if config.lora is not None:
        model = with_lora(model, config.lora, adapter_dir)
    elif adapter_dir is not None:
        raise ConfigError(f"trainer.lora: {adapter_dir} holds an adapter, but [trainer.lora] is not set")
    return model


def checkpoint_every(model: torch.nn.Module, every: int) -> None:
    """Of a model whose gradient checkpointing is on, recompute only every ``every``-th decoder layer
    (the first, then every ``every``-th after it); the others keep their activations for the
    backward pass. Memory and recomputation both scale with the share checkpointed."""
    if every == 1:
        return
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise ConfigError(
            f"trainer.gradient_checkpointing_every = {every}: this model's layers cannot be "
            "checkpointed one by one (set it to 1)"
        )
    for index, layer in enumerate(layers):
        layer.gradient_checkpointing = index % every == 0


def load_reference(reference_dir: str | Path) -> torch.nn.Module:
    """The KL penalty's frozen fp32 reference model, in eval mode."""
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(str(reference_dir), dtype=torch.float32)
    reference.config.use_cache = False
    reference.requires_grad_(False)
    reference.eval()
    return reference


#: Files a checkpoint takes from the folder the policy was loaded from, beside the weights (those
#: ``save_pretrained`` writes itself are left as it writes them).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


def read_tokenizer_files(model_dir: Path) -> dict[str, bytes]:
    """The ``TOKENIZER_FILES`` of ``model_dir`` that exist, by name (a few MB at most)."""
    return {name: (model_dir / name).read_bytes() for name in TOKENIZER_FILES if (model_dir / name).is_file()}


class TrainablePolicy:
    def __init__(
        self,
        model_dir: str | Path,
        config: PolicyConfig | None = None,
        *,
        reference_dir: str | Path | None = None,
        adapter_dir: str | Path | None = None,
        prepare_model: Callable[[torch.nn.Module], None] | None = None,
        **settings: Any,
    ):
        """``config``, or the ``PolicyConfig`` fields as keywords (``optimizer=``, ``total_steps=``,
        ``share_prefixes=``...). ``prepare_model`` places the model instead of ``config.device``
        (a torchrun rank shards it: ``distributed.ShardedPolicy``). With ``config.lora``, ``adapter_dir``
        is the adapter a ``--resume`` continues (on the base weights in ``model_dir``), and a
        ``reference_dir`` naming ``model_dir`` is the model itself with its adapters switched off:
        no second copy of the weights."""
        if config is not None and settings:
            raise ConfigError(f"TrainablePolicy: give config or settings, not both ({', '.join(settings)})")
        self.config = config if config is not None else PolicyConfig(**settings)
        self.model_dir = Path(model_dir)
        # Read now, not at each checkpoint: a run resumed from ``checkpoints/latest.old`` (a kill
        # mid-swap) loads from a folder its first checkpoint deletes, and every later checkpoint
        # then went without its tokenizer (unloadable by vLLM and by the next resume's engine).
        self._tokenizer_files = read_tokenizer_files(self.model_dir)
        torch.manual_seed(self.config.seed)
        model = load_model(model_dir, self.config, adapter_dir)
        #: The KL penalty's frozen reference (None without one). A torchrun rank shards it itself.
        #: LoRA on the reference's own weights: the policy's model is the reference, adapters off
        #: (``train_step.micro_logprobs``); it is placed and prepared with the model.
        shared_base = (
            self.config.lora is not None
            and reference_dir is not None
            and Path(reference_dir).resolve() == self.model_dir.resolve()
        )
        reference = None
        if reference_dir is not None and not shared_base:
            reference = load_reference(reference_dir)
        if prepare_model is None:
            # "auto": the first GPU when there is one. A torchrun rank's prepare_model places it.
            device = self.config.device
            place = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
            model.to(place)
            if reference is not None:
                reference.to(place)
        model.train()
        if prepare_model is not None:
            # Before the optimizer is built: FSDP (trainer/distributed.py) replaces the parameters
            # with sharded ones, and the optimizer must hold those.
            prepare_model(model)
        optimizer_config = self.config.optimizer
        device = next(model.parameters()).device
        optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=optimizer_config.lr,
            betas=optimizer_config.betas,
            weight_decay=optimizer_config.weight_decay,
            # On CPU torch's default is a loop over the parameters that allocates temporaries the
            # size of each (SmolLM2's 113 MB embedding among them): the fused kernel allocates none
            # (0.09 GB less at the arithmetic example's step peak) and is no slower. A sharded
            # (FSDP) or GPU policy keeps torch's default.
            fused=True if device.type == "cpu" and prepare_model is None else None,
        )
        if shared_base:
            reference = model
        self.learner = Learner(
            model=model,
            optimizer=optimizer,
            scheduler=torch.optim.lr_scheduler.LambdaLR(
                optimizer, lr_lambda(optimizer_config, self.config.total_steps)
            ),
            config=self.config,
            device=device,
            autocast=resolve_autocast(self.config.autocast, on_gpu=device.type == "cuda"),
            reference=reference,
        )

    @classmethod
    def from_config(
        cls,
        config: TrainConfig,
        model_dir: str | Path,
        *,
        reference_dir: str | Path | None = None,
        adapter_dir: str | Path | None = None,
        prepare_model: Callable[[torch.nn.Module], None] | None = None,
    ) -> TrainablePolicy:
        """The policy a ``harnessrl train`` run trains (one process, or every torchrun rank).

        With ``algorithm.kl_coef > 0`` it holds a reference model loaded from ``reference_dir``
        (default ``model_dir``: the weights it starts from; with LoRA the base weights themselves).
        ``adapter_dir``: the LoRA adapter a ``--resume`` continues."""
        return cls(
            model_dir,
            PolicyConfig.from_train_config(config),
            reference_dir=(reference_dir or model_dir) if config.algorithm.kl_coef > 0 else None,
            adapter_dir=adapter_dir,
            prepare_model=prepare_model,
        )

    # -- the learner's parts, by name ----------------------------------------------------------------
    @property
    def model(self) -> torch.nn.Module:
        return self.learner.model

    @property
    def reference(self) -> torch.nn.Module | None:
        return self.learner.reference

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.learner.optimizer

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        return self.learner.scheduler

    @property
    def device(self) -> torch.device:
        return self.learner.device

    # -- forward -------------------------------------------------------------------------------------
    def logprobs(
        self,
        input_ids_B_T: torch.Tensor,
        position_ids_B_T: torch.Tensor,
        temperature: float,
        loss_mask_B_T: torch.Tensor | None = None,
        *,
        with_entropy: bool = False,
    ) -> TokenLogprobs:
        """``forward.sequence_logprobs`` of the policy's model: (B, T) log-probs at ``temperature``
        where ``loss_mask_B_T`` is set (every token but each row's first without one), 0 elsewhere."""
        return sequence_logprobs(
            self.model,
            input_ids_B_T,
            position_ids_B_T,
            temperature,
            loss_mask_B_T,
            with_entropy=with_entropy,
            autocast=self.learner.autocast,
        )

    @torch.no_grad()
    def response_logprobs(
        self, prompt_ids: list[int], response_ids: list[int], temperature: float = 1.0
    ) -> list[float]:
        """log p(response token | prompt, earlier response tokens) at ``temperature``: what an engine
        serving these weights reports for the same tokens (the served-weights check uses it)."""
        ids = torch.tensor([prompt_ids + response_ids], device=self.device)
        positions = torch.arange(ids.shape[1], device=self.device)[None, :]
        with evaluating(self.model):
            return self.logprobs(ids, positions, temperature).logprobs[0, len(prompt_ids) :].tolist()

    # -- one optimizer step --------------------------------------------------------------------------
    def train_step(
        self,
        samples: list[Sample],
        algorithm: AlgorithmConfig,
        *,
        temperature: float,
        micro_batch_tokens: int,
    ) -> dict[str, float]:
        """One optimizer step over all ``samples`` (all samples of every rollout of the step)."""
        return train_step(
            self.learner, samples, algorithm, temperature=temperature, micro_batch_tokens=micro_batch_tokens
        )

    # -- weights out ---------------------------------------------------------------------------------
    def engine_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights an in-process engine loads, detached, under the base model's parameter names:
        all of them; with LoRA only the adapted layers' (adapters merged in), since nothing else
        changes (the engine loads a partial state dict in place; ``benchmarks/lora.py``)."""
        if self.config.lora is None:
            return {k: v.detach() for k, v in self.model.state_dict().items()}
        return adapted_weights(self.model)

    def save_adapter(self, folder: Path) -> bool:
        """The LoRA adapter alone, in PEFT's format (``adapter_config.json``,
        ``adapter_model.safetensors``: what vLLM's and SGLang's runtime LoRA loading takes) into
        ``folder``; False, writing nothing, without ``[trainer.lora]``."""
        if self.config.lora is None:
            return False
        self.model.save_pretrained(str(folder), **ADAPTER_LAYERS_ONLY)
        return True

    def save_checkpoint(
        self,
        folder: Path,
        *,
        with_optimizer: bool = True,
        state_dict: dict[str, torch.Tensor] | None = None,
        optimizer_state: dict[str, Any] | None = None,
        rank_rng: list[dict[str, torch.Tensor]] | None = None,
    ) -> Path:
        """Hugging Face format (loadable by transformers / vLLM as is), plus tokenizer files and the
        optimizer/scheduler/generator state for ``--resume``. Written to a temp folder, then renamed.

        ``state_dict`` / ``optimizer_state`` replace the model's and optimizer's own: a sharded
        (FSDP) policy passes the full tensors it gathered on rank 0 (with LoRA, the PEFT model's
        whole state dict, adapter included: the folder gets the adapter and the merged weights), and
        ``rank_rng`` every rank's generator state, by rank (``rng`` is rank 0's, as one process's)."""
        tmp = folder.with_name(folder.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        if self.config.lora is not None:
            # The merged weights are new tensors beside the model's (W + scale * B @ A): peft's
            # merge_adapter/unmerge_adapter round trip in the live weights left them a rounding error
            # from where they were, so every checkpoint moved the base weights being trained.
            if state_dict is None:
                self.save_adapter(tmp / ADAPTER_DIR)
                merged = merged_from_state(self.model, self.model.state_dict(), adapted_only=False)
            else:  # a sharded policy's gathered PEFT state dict: the adapter and the base in one
                save_adapter_state(self.model, state_dict, tmp / ADAPTER_DIR)
                merged = merged_from_state(self.model, state_dict, adapted_only=False)
            base = self.model.get_base_model()  # type: ignore[attr-defined]
            base.save_pretrained(str(tmp), state_dict=merged, safe_serialization=True)
        else:
            self.model.save_pretrained(str(tmp), state_dict=state_dict, safe_serialization=True)
        for name, data in self._tokenizer_files.items():
            if not (tmp / name).exists():
                (tmp / name).write_bytes(data)
        if with_optimizer:
            trainer_state = {
                "optimizer": self.optimizer.state_dict() if optimizer_state is None else optimizer_state,
                "scheduler": self.scheduler.state_dict(),
                "rng": rng_state(self.device),
            }
            if rank_rng is not None:
                trainer_state["rank_rng"] = rank_rng
            torch.save(trainer_state, tmp / "trainer_state.pt")
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
        return folder

    def load_trainer_state(self, folder: Path) -> None:
        """The optimizer, LR schedule and random number generator state ``save_checkpoint`` wrote (a
        checkpoint written before the generator state was saved keeps the freshly seeded one)."""
        state = read_trainer_state(folder)  # a damaged file: CheckpointUnreadable, not a traceback
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        apply_optimizer_config(self.optimizer, self.scheduler, self.config.optimizer)
        if "rng" in state:
            set_rng_state(state["rng"], self.device)


def apply_optimizer_config(
    optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler, config: OptimizerConfig
) -> None:
    """After a checkpoint's optimizer and LR-schedule state were loaded: this run's ``[optimizer]``
    settings, not the saved ones. ``load_state_dict`` brings back the saved param groups' ``lr``,
    ``betas`` and ``weight_decay`` and the schedule's base rates, so ``--resume --set optimizer.lr=...``
    went on at the old rate, silently. The step count, AdamW's moments and the schedule's position
    are kept; the rate is the (possibly new) schedule's at that position: with unchanged settings,
    exactly the saved one."""
    for group in optimizer.param_groups:
        group["initial_lr"] = config.lr
        group["betas"] = tuple(config.betas)
        group["weight_decay"] = config.weight_decay
    scheduler.base_lrs = [config.lr] * len(optimizer.param_groups)
    if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
        for group, factor in zip(optimizer.param_groups, scheduler.lr_lambdas, strict=True):
            group["lr"] = config.lr * factor(scheduler.last_epoch)
        scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]  # what get_last_lr() reads


@contextlib.contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in eval mode for the block, then as it was: what an engine serves has no dropout, and
    a forward in train mode with LoRA (or model) dropout gave noisy log-probs (two calls: -8.23 and
    -10.87 for one token) and drew from the generator a resumed run restores."""
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """torch's generator state on the CPU (and on ``device``'s GPU): what draws dropout masks (LoRA
    dropout, a model's own). A checkpoint keeps it so that the steps after ``--resume`` draw the masks
    the run would have drawn, not the first steps' again (``__init__`` seeds the generator)."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    """Restore what ``rng_state`` returned (the GPU's part only on a GPU, and only if it was saved)."""
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
