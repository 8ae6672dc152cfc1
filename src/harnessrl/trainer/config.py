"""The one TOML file of ``harnessrl train``: every section is a typed model (``extra="forbid"``).

Sections: ``[run]``, ``[engine]``, ``[gateway]``, ``[harness]``, ``[evaluator]``, ``[controller]``,
``[tasks]`` / ``[heldout]``, ``[algorithm]``, ``[optimizer]``, ``[trainer]``, ``[metrics]``.
Defaults are the recommended settings; ``docs/train.md`` documents each field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.config import REMOTE_KINDS, EngineConfig, GatewayConfig, Section, StoreConfig
from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.controller import ControllerConfig
from harnessrl.controller.evaluators import EvaluatorConfig, parse_evaluator_config
from harnessrl.controller.kubernetes.config import KubernetesRunnerConfig
from harnessrl.retrieval.config import RetrievalConfig
from harnessrl.trainer.task_sources import TaskSource


class RunSection(Section):
    name: str = "run"
    dir: str | None = Field(
        default=None, description="run folder (default runs/<name> beside the config file)"
    )
    seed: int = 0

    @field_validator("name")
    @classmethod
    def _plain_folder_name(cls, value: str) -> str:
        # The default run folder is runs/<name>: "", ".", ".." or a path would put it elsewhere
        # (runs/ itself, or over another run's files) and slip past the "already exists" guard.
        if value in ("", ".", "..") or "/" in value or "\\" in value:
            raise ValueError(f"{value!r} must be a plain folder name (no '/', not '.' or '..')")
        return value


class OptimizerConfig(Section):
    lr: float = Field(default=1e-5, gt=0, allow_inf_nan=False)
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    grad_clip: float | None = Field(default=1.0, gt=0)  # inf: no clipping (the norm is still reported)
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(default=0, ge=0)
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, betas: tuple[float, float]) -> tuple[float, float]:
        # AdamW's moment decays: a NaN or inf one made every update NaN from the first step.
        if not all(0.0 <= beta < 1.0 for beta in betas):
            raise ValueError(f"each must be in [0, 1) (got {list(betas)})")
        return betas


class LoraSection(Section):
    """``[trainer.lora]``: train low-rank adapters (PEFT) instead of the whole model. The modules and
    the rank are checked against the model before a run starts (``trainer/lora.py``)."""

    r: int = Field(default=16, ge=1, description="rank, at most the smaller side of each target layer")
    alpha: int = Field(default=32, ge=1, description="scaling: the update is alpha / r times B @ A")
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="names of the linear layers that get adapters (the last part of their module name)",
    )


class PolicyConfig(Section):
    """How the trainer's policy is built and stepped: what ``TrainablePolicy`` owns (its
    ``config``). ``from_train_config`` takes it from a run's ``[optimizer]``, ``[trainer]`` and
    ``[run]`` sections."""

    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    total_steps: int = Field(default=1, ge=1, description="optimizer steps the LR schedule spans")
    lora: LoraSection | None = None
    gradient_checkpointing: bool = False
    gradient_checkpointing_every: int = Field(default=1, ge=1)
    autocast: Literal["none", "bf16", "auto"] = "none"
    seed: int = 0
    row_tokens: int = Field(default=512, ge=1, description="packed row length inside a micro-batch")
    share_prefixes: bool = True
    device: str = "auto"

    @classmethod
    def from_train_config(cls, config: TrainConfig) -> PolicyConfig:
        t = config.trainer
        return cls(
            optimizer=config.optimizer,
            total_steps=t.steps,
            lora=t.lora,
            gradient_checkpointing=t.gradient_checkpointing,
            gradient_checkpointing_every=t.gradient_checkpointing_every,
            autocast=t.autocast,
            seed=config.run.seed,
            row_tokens=t.row_tokens,
            share_prefixes=t.share_prefixes,
            device=t.device,
        )


class TrainerSection(Section):
    # With a remote engine (vllm or sglang servers) the weights the trainer starts from (tiny, smollm2 or a
    # Hugging Face folder): the servers must serve the same weights at step 0.
    model: str | None = None
    mode: Literal["sync", "async"] = "async"
    # "local": this process launches the harnesses; "external": separately started
    # `harnessrl controller` processes (local sandboxes elsewhere, Kubernetes Jobs) take the queued
    # rollouts from the shared store (docs/scale.md)
    controllers: Literal["local", "external"] = "local"
    # Drive gateways started elsewhere (`harnessrl gateway`, docs/scale.md) instead of serving one:
    # the trainer pauses them over the control API and loads the remote servers itself.
    gateway_url: str | None = None
    steps: int = Field(default=10, ge=1)
    tasks_per_step: int = Field(default=4, ge=1)
    group_size: int = Field(default=8, ge=1, description="rollouts per task (one group)")
    max_in_flight: int | None = Field(
        default=None, ge=1, description="async: rollouts queued or running at once (default 2 steps' worth)"
    )
    max_staleness: int = Field(
        default=1, ge=0, description="async: newest minus oldest policy version allowed"
    )
    stale_samples: Literal["drop", "downweight"] = "drop"
    # At least 0.01: vLLM (and the embedded engine, which follows it) samples any temperature in
    # (0, 0.01) at 0.01, so the trainer's logprobs at a smaller one would not be the sampler's.
    temperature: float = Field(
        default=1.0,
        ge=0.01,
        allow_inf_nan=False,
        description="sampling temperature forced on training rollouts (at least 0.01)",
    )
    top_p: float | Literal["harness"] = Field(
        default=1.0,
        description=(
            'nucleus forced on training rollouts, in (0, 1]; "harness" lets the harness\'s top_p through '
            "(the recorded logprobs are then those of the renormalized nucleus, which the trainer's "
            "full-softmax recomputation does not reproduce: the importance ratio absorbs the difference)"
        ),
    )
    # le: what SamplingOverrides (and the engines) take; a larger cap was a traceback at start-up
    max_tokens: int | None = Field(
        default=None, ge=1, le=2**31 - 1, description="cap on each call's new tokens"
    )
    served_weights_tolerance: float = Field(
        default=0.1,
        ge=0,
        description=(
            "remote engines: before the first rollout each server's logprobs on a probe must be within "
            "this many nats per token (mean) of the trainer's; 0 skips the check"
        ),
    )
    micro_batch_tokens: int = Field(default=4096, ge=16)
    row_tokens: int = Field(default=512, ge=16, description="packed row length inside a micro-batch")
    device: str = Field(
        default="auto", description='"auto" (the first GPU if any, else CPU), "cpu", "cuda:0", ...'
    )
    share_prefixes: bool = Field(
        default=True, description="compute tokens that samples share at their start once (prefix_tree.py)"
    )
    max_sample_tokens: int | None = Field(default=None, ge=16)
    # "auto": bf16 on a GPU or a CPU with native bf16 (AMX / AVX512-BF16), else none (harnessrl.hardware)
    autocast: Literal["none", "bf16", "auto"] = "none"
    gradient_checkpointing: bool = False
    gradient_checkpointing_every: int = Field(
        default=1,
        ge=1,
        description=(
            "with gradient_checkpointing: recompute every Nth decoder layer in the backward pass and "
            "keep the others' activations (1: all; 2: half the activation memory saved for half the "
            "recomputation)"
        ),
    )
    lora: LoraSection | None = None
    rollout_deadline_s: float | None = Field(
        default=None,
        gt=0,
        description=(
            "a rollout whose attempt is still running this many seconds after it started is cancelled "
            "and counted (rollouts/cancelled_stuck); default: harness.timeout_s + the evaluator's "
            "timeout_s + 120"
        ),
    )
    eval_every: int = Field(default=0, ge=0, description="steps between held-out evaluations (0: never)")
    eval_temperature: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    save_every: int = Field(default=0, ge=0, description="steps between numbered checkpoints (0: end only)")


class MetricsSection(Section):
    tensorboard: bool = True
    wandb_project: str | None = None
    progress: bool = True


#: Most rollouts one step may take (``tasks_per_step`` x ``group_size``): far past any real run (the
#: report's: 32 x 8), short of planning more rows than memory holds.
MAX_ROLLOUTS_PER_STEP = 1_000_000

#: Added to the harness's and the evaluator's timeouts for the default ``trainer.rollout_deadline_s``:
#: workspace set-up, sandbox start, the audit and writing the result, none of which has a timeout.
ROLLOUT_DEADLINE_MARGIN_S = 120.0


class TrainConfig(Section):
    run: RunSection = Field(default_factory=RunSection)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    gateway: GatewayConfig = Field(default_factory=lambda: GatewayConfig(port=0))
    harness: HarnessSpec
    evaluator: EvaluatorConfig
    controller: ControllerConfig = Field(default_factory=ControllerConfig)
    tasks: TaskSource
    heldout: TaskSource | None = None
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    metrics: MetricsSection = Field(default_factory=MetricsSection)
    # None: the run folder's own SQLite file; a postgresql:// URL shares one store (docs/scale.md)
    store: StoreConfig | None = None
    # a corpus the gateway serves to the harness's search tool (docs/retrieval.md)
    retrieval: RetrievalConfig | None = None
    # read by this run's `harnessrl controller --config SAME_FILE` processes, which launch the harnesses
    # as Kubernetes Jobs (docs/kubernetes.md); the run itself launches nothing: controllers = "external"
    kubernetes: KubernetesRunnerConfig | None = None

    def rollout_deadline_s(self) -> float:
        """``trainer.rollout_deadline_s``, or what a healthy attempt can take at most: the harness's
        timeout, then the evaluator's, plus ``ROLLOUT_DEADLINE_MARGIN_S``."""
        if self.trainer.rollout_deadline_s is not None:
            return self.trainer.rollout_deadline_s
        evaluator_s = getattr(self.evaluator, "timeout_s", 0.0)  # exact_match has no timeout
        return self.harness.timeout_s + evaluator_s + ROLLOUT_DEADLINE_MARGIN_S

    @field_validator("evaluator", mode="before")
    @classmethod
    def _parse_evaluator(cls, value: Any) -> Any:
        # parse_evaluator_config names the field as written (evaluator.command), not by the union's tag
        return parse_evaluator_config(value) if isinstance(value, Mapping) else value

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        top_p = self.trainer.top_p
        if top_p != "harness" and not 0 < top_p <= 1:
            raise ValueError(f'trainer.top_p: must be in (0, 1] or "harness", got {top_p}')
        t = self.trainer
        if t.mode == "async" and t.max_in_flight is not None and t.max_in_flight < t.group_size:
            # A group's rollouts are created together: no group could ever start, and the run waited
            # for its first step forever.
            raise ValueError(
                f"trainer.max_in_flight: {t.max_in_flight} is less than trainer.group_size "
                f"({t.group_size}): a group's rollouts are admitted together, so none could start"
            )
        if t.tasks_per_step * t.group_size > MAX_ROLLOUTS_PER_STEP:
            # Each is planned at once (a row and a task copy): 10^11 of them ran the process out of
            # memory (SIGKILL) with its run folder made.
            raise ValueError(
                f"trainer.tasks_per_step: {t.tasks_per_step} tasks x trainer.group_size {t.group_size} is "
                f"{t.tasks_per_step * t.group_size} rollouts a step, more than {MAX_ROLLOUTS_PER_STEP:,}"
            )
        if self.engine.teacher is not None:
            raise ValueError(
                "engine.teacher: teacher mode records calls for harnessrl sft (run harnessrl gateway "
                "with it); a training run generates with its policy"
            )
        if self.engine.source.kind in REMOTE_KINDS and not self.trainer.model:
            raise ValueError(
                "trainer.model: required with a remote engine (the weights the trainer starts from, "
                "the same ones the servers serve)"
            )
        if self.trainer.gateway_url:
            needs = {
                "trainer.controllers": self.trainer.controllers == "external",
                "store.url": self.store is not None,
                "engine.model": self.engine.source.kind in REMOTE_KINDS,
                "gateway.admin_key": bool(self.gateway.admin_key),
            }
            missing = [name for name, ok in needs.items() if not ok]
            if missing:
                raise ValueError(
                    f"trainer.gateway_url needs {', '.join(missing)}: external controllers, the store "
                    "the gateways share, remote engine servers the trainer loads itself, and the "
                    "gateways' admin key"
                )
        if self.kubernetes is not None and self.trainer.controllers != "external":
            raise ValueError(
                "kubernetes: read by `harnessrl controller` processes; the run needs trainer.controllers = "
                '"external" for them to launch its harnesses (docs/scale.md)'
            )
        if self.trainer.lora is not None and self.trainer.gateway_url:
            raise ValueError(
                "trainer.lora: not supported with trainer.gateway_url yet (gateways started elsewhere "
                "would not send their calls to each step's adapter); serve the gateway from this run"
            )
        if self.engine.source.kind == "scripted":
            raise ValueError(
                "engine.model: a scripted engine cannot be trained; use tiny, smollm2 or a model"
            )
        return self
