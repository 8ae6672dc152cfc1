"""The trainable policy: a transformers causal LM, its optimizer step and its checkpoints.

The trainer keeps its own fp32 copy of the weights (the master copy); the engine serving rollouts
gets a copy of them after every step (``engine_state_dict``). Log-probabilities are computed at the
sampling temperature the engine used (``log_softmax(logits / T)``), so they are comparable with the
behaviour log-probabilities recorded by the gateway; with ``with_entropy`` the same forward also gives
each trained token's entropy at that temperature (``algorithms.losses.token_entropy``, no grad), from
the logits it already computed.

The optimizer step itself (micro-batching, forward/backward, metrics) is ``trainer.train_step``,
the same code for one process and for torchrun ranks. With ``reference_dir`` (``algorithm.kl_coef >
0``) the policy also holds a frozen reference model for the KL penalty: a full fp32 copy of those
weights, never trained, in eval mode.
"""

from __future__ import annotations

import contextlib
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.algorithms.losses import token_entropy, token_logprobs
from harnessrl.hardware import resolve_autocast
from harnessrl.trainer.config import LoraSection, OptimizerConfig
from harnessrl.trainer.prefix_tree import PrefixBatch
from harnessrl.trainer.train_step import train_step
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


class TrainablePolicy:
    def __init__(
        self,
        model_dir: str | Path,
        optimizer: OptimizerConfig,
        total_steps: int,
        *,
        lora: LoraSection | None = None,
        gradient_checkpointing: bool = False,
        autocast: str = "none",
        seed: int = 0,
        row_tokens: int = 512,
        share_prefixes: bool = True,
        device: str = "auto",
        reference_dir: str | Path | None = None,
        prepare_model: Callable[[torch.nn.Module], None] | None = None,
    ):
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        self.model_dir = Path(model_dir)
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        model.config.use_cache = False
        if gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.lora = lora
        if lora is not None:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(
                model,
                LoraConfig(
                    r=lora.r,
                    lora_alpha=lora.alpha,
                    lora_dropout=lora.dropout,
                    target_modules=lora.target_modules,
                    task_type="CAUSAL_LM",
                ),
            )
        #: The KL penalty's frozen reference (None without one). A torchrun rank shards it itself.
        self.reference: torch.nn.Module | None = None
        if reference_dir is not None:
            self.reference = AutoModelForCausalLM.from_pretrained(str(reference_dir), dtype=torch.float32)
            self.reference.config.use_cache = False
            self.reference.requires_grad_(False)
            self.reference.eval()
        if prepare_model is None:
            # "auto": the first GPU when there is one. A torchrun rank's prepare_model places it.
            place = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
            model.to(place)
            if self.reference is not None:
                self.reference.to(place)
        self.model = model
        self.model.train()
        if prepare_model is not None:
            # Before the optimizer is built: FSDP (trainer/distributed.py) replaces the parameters
            # with sharded ones, and the optimizer must hold those.
            prepare_model(model)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=optimizer.lr, betas=optimizer.betas, weight_decay=optimizer.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(optimizer, total_steps))
        self.grad_clip = optimizer.grad_clip
        self.row_tokens = row_tokens
        self.share_prefixes = share_prefixes
        self.device = next(self.model.parameters()).device
        self.autocast = resolve_autocast(autocast, on_gpu=self.device.type == "cuda")

    @classmethod
    def from_config(
        cls,
        config: TrainConfig,
        model_dir: str | Path,
        *,
        reference_dir: str | Path | None = None,
        prepare_model: Callable[[torch.nn.Module], None] | None = None,
    ) -> TrainablePolicy:
        """The policy a ``harnessrl train`` run trains (one process, or every torchrun rank).

        With ``algorithm.kl_coef > 0`` it holds a reference model loaded from ``reference_dir``
        (default ``model_dir``: the weights it starts from)."""
        t = config.trainer
        return cls(
            model_dir,
            config.optimizer,
            t.steps,
            lora=t.lora,
            gradient_checkpointing=t.gradient_checkpointing,
            autocast=t.autocast,
            seed=config.run.seed,
            row_tokens=t.row_tokens,
            share_prefixes=t.share_prefixes,
            device=t.device,
            reference_dir=(reference_dir or model_dir) if config.algorithm.kl_coef > 0 else None,
            prepare_model=prepare_model,
        )

    # -- forward -------------------------------------------------------------------------------------
    def _autocast(self):
        if self.autocast == "bf16":
            return torch.autocast("cpu" if not torch.cuda.is_available() else "cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def logprobs(
        self,
        input_ids_B_T: torch.Tensor,
        position_ids_B_T: torch.Tensor,
        temperature: float,
        loss_mask_B_T: torch.Tensor | None = None,
        *,
        model: torch.nn.Module | None = None,
        with_entropy: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """log p(token t | tokens < t) at temperature T, aligned with the tokens: (B, T).

        With ``loss_mask_B_T`` the vocabulary projection is applied only where a logprob is needed
        (the position before each trained token); everywhere else the result is 0. Prompts and tool
        output are most of an agent's tokens, and the LM head over a 49k vocabulary at every position
        was the largest single cost of a step. ``model``: another model than the policy's (the
        reference). ``with_entropy``: also the entropy of the tempered distribution each token was
        drawn from, in the same layout (0 where the log-prob is 0), detached: ``(logprobs, entropy)``.
        """
        model = self.model if model is None else model
        if loss_mask_B_T is None:
            with self._autocast():
                logits = model(input_ids=input_ids_B_T, position_ids=position_ids_B_T, use_cache=False).logits
            logits = logits.float()
            if temperature != 1.0:
                logits = logits / temperature
            logprobs_B_T = token_logprobs(logits, input_ids_B_T)  # (B, T)
            if not with_entropy:
                return logprobs_B_T
            B, T, V = logits.shape
            entropy_B_T = torch.zeros(logprobs_B_T.shape, dtype=torch.float32, device=logits.device)
            entropy_B_T[:, 1:] = token_entropy(logits[:, :-1].reshape(-1, V)).view(B, T - 1)
            return logprobs_B_T, entropy_B_T
        decoder = model.get_decoder()
        lm_head = model.get_output_embeddings()
        with self._autocast():
            hidden_B_T_H = decoder(
                input_ids=input_ids_B_T, position_ids=position_ids_B_T, use_cache=False
            ).last_hidden_state
            rows, cols = loss_mask_B_T[:, 1:].nonzero(as_tuple=True)  # token (b, c + 1) is trained
            logits_N_V = lm_head(hidden_B_T_H[rows, cols])  # predicted from the position before it
        logits_N_V = logits_N_V.float()
        if temperature != 1.0:
            logits_N_V = logits_N_V / temperature
        targets_N = input_ids_B_T[rows, cols + 1]
        logp_N = logits_N_V.gather(-1, targets_N[:, None]).squeeze(-1) - logits_N_V.logsumexp(-1)
        out_B_T = torch.zeros(input_ids_B_T.shape, dtype=logp_N.dtype, device=logp_N.device)
        logprobs_B_T = out_B_T.index_put((rows, cols + 1), logp_N)
        if not with_entropy:
            return logprobs_B_T
        entropy_B_T = torch.zeros(input_ids_B_T.shape, dtype=torch.float32, device=logp_N.device)
        return logprobs_B_T, entropy_B_T.index_put((rows, cols + 1), token_entropy(logits_N_V))

    @torch.no_grad()
    def response_logprobs(
        self, prompt_ids: list[int], response_ids: list[int], temperature: float = 1.0
    ) -> list[float]:
        """log p(response token | prompt, earlier response tokens) at ``temperature``: what an engine
        serving these weights reports for the same tokens (the served-weights check uses it)."""
        ids = torch.tensor([prompt_ids + response_ids], device=self.device)
        positions = torch.arange(ids.shape[1], device=self.device)[None, :]
        logprobs_B_T = self.logprobs(ids, positions, temperature)
        return logprobs_B_T[0, len(prompt_ids) :].tolist()

    def prefix_logprobs(
        self,
        batch: PrefixBatch,
        temperature: float,
        *,
        model: torch.nn.Module | None = None,
        with_entropy: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Log-probs of a shared-prefix micro-batch's trained tokens, in its (1, N) entry layout;
        ``with_entropy`` as in ``logprobs``."""
        model = self.model if model is None else model
        decoder = model.get_decoder()
        lm_head = model.get_output_embeddings()
        mask_B_1_T_T = batch.attention_B_T_T[:, None]
        if model.config._attn_implementation != "sdpa":
            # eager attention adds the mask to the scores; sdpa takes True = attend
            mask_B_1_T_T = torch.zeros(mask_B_1_T_T.shape).masked_fill(
                ~mask_B_1_T_T, torch.finfo(torch.float32).min
            )
        with self._autocast():
            hidden_B_T_H = decoder(
                input_ids=batch.input_ids_B_T,
                position_ids=batch.position_ids_B_T,
                attention_mask=mask_B_1_T_T,
                use_cache=False,
            ).last_hidden_state
            logits_N_V = lm_head(hidden_B_T_H[batch.hidden_row_N, batch.hidden_col_N])
        logits_N_V = logits_N_V.float()
        if temperature != 1.0:
            logits_N_V = logits_N_V / temperature
        logp_N = logits_N_V.gather(-1, batch.targets_N[:, None]).squeeze(-1) - logits_N_V.logsumexp(-1)
        if not with_entropy:
            return logp_N[None]
        return logp_N[None], token_entropy(logits_N_V)[None]

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
            self, samples, algorithm, temperature=temperature, micro_batch_tokens=micro_batch_tokens
        )

    # -- weights out ---------------------------------------------------------------------------------
    def engine_state_dict(self) -> dict[str, torch.Tensor]:
        """Full weights (LoRA merged in), detached, under the base model's parameter names."""
        if self.lora is None:
            return {k: v.detach() for k, v in self.model.state_dict().items()}
        # Merge the adapters into the base weights, copy them out, and unmerge so training goes on
        # with separate adapters. peft keeps a wrapped layer's original weight at "<name>.base_layer".
        self.model.merge_adapter()  # type: ignore[attr-defined]
        try:
            base = self.model.get_base_model()  # type: ignore[attr-defined]
            return {
                k.replace(".base_layer", ""): v.detach().clone()
                for k, v in base.state_dict().items()
                if "lora_" not in k
            }
        finally:
            self.model.unmerge_adapter()  # type: ignore[attr-defined]

    def save_checkpoint(
        self,
        folder: Path,
        *,
        with_optimizer: bool = True,
        state_dict: dict[str, torch.Tensor] | None = None,
        optimizer_state: dict[str, Any] | None = None,
    ) -> Path:
        """Hugging Face format (loadable by transformers / vLLM as is), plus tokenizer files and the
        optimizer/scheduler state for ``--resume``. Written to a temp folder, then renamed.

        ``state_dict`` / ``optimizer_state`` replace the model's and optimizer's own: a sharded
        (FSDP) policy passes the full tensors it gathered on rank 0."""
        tmp = folder.with_name(folder.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        if self.lora is not None:
            self.model.save_pretrained(str(tmp / "adapter"))
            base = self.model.get_base_model()  # type: ignore[attr-defined]
            base.save_pretrained(str(tmp), state_dict=self.engine_state_dict(), safe_serialization=True)
        else:
            self.model.save_pretrained(str(tmp), state_dict=state_dict, safe_serialization=True)
        for name in (
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "chat_template.jinja",
            "generation_config.json",
        ):
            src = self.model_dir / name
            if src.exists() and not (tmp / name).exists():
                shutil.copy2(src, tmp / name)
        if with_optimizer:
            torch.save(
                {
                    "optimizer": self.optimizer.state_dict() if optimizer_state is None else optimizer_state,
                    "scheduler": self.scheduler.state_dict(),
                },
                tmp / "trainer_state.pt",
            )
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
        return folder

    def load_trainer_state(self, folder: Path) -> None:
        state: dict[str, Any] = torch.load(folder / "trainer_state.pt", weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
