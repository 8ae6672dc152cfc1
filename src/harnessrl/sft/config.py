"""The TOML file of ``harnessrl sft``: typed sections (``extra="forbid"``), documented in docs/sft.md.

``[run]``, ``[optimizer]`` and ``[metrics]`` are ``harnessrl train``'s own sections; ``[source]`` says
where the recorded rollouts are, ``[select]`` which of them are training data, ``[sft]`` the student
and how it is trained.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from harnessrl.config import Section
from harnessrl.gateway.body_models import RESERVED_TEMPLATE_KWARGS
from harnessrl.trainer.config import LoraSection, MetricsSection, OptimizerConfig, PolicyConfig, RunSection


class SourceSection(Section):
    run_dir: str | None = Field(
        default=None, description="a run folder whose store (harnessrl.db) holds the recorded rollouts"
    )
    store_url: str | None = Field(
        default=None, description="or a store itself: a SQLite file or postgresql:// URL"
    )
    run_name: str | None = Field(default=None, description="only the rollouts of this run (default: all)")

    @model_validator(mode="after")
    def _one(self) -> SourceSection:
        if (self.run_dir is None) == (self.store_url is None):
            raise ValueError("give one of source.run_dir (a run folder) or source.store_url")
        return self

    def url(self) -> str:
        return (
            self.store_url if self.store_url is not None else str(Path(self.run_dir or ".") / "harnessrl.db")
        )


class SelectSection(Section):
    min_reward: float = Field(
        default=1.0,
        allow_inf_nan=False,  # nan compares false with every reward: it kept every rollout
        description="keep rollouts whose reward is at least this",
    )
    allow_flags: list[str] = Field(
        default_factory=list,
        description="flags a kept rollout may carry (any other flag drops it; audit findings always do)",
    )
    max_rollouts: int | None = Field(default=None, ge=1)


class SftSection(Section):
    model: str = Field(default="tiny", description="the student: tiny, smollm2, a model folder or a .gguf")
    cache_dir: str | None = None
    tool_call_parser: str = Field(
        default="auto", description="the student's tool-call format (gateway names)"
    )
    reasoning_parser: str = Field(
        default="auto", description="the student's reasoning format (gateway names)"
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="the student's template variables (e.g. enable_thinking); a request's own take precedence",
    )
    epochs: int = Field(default=3, ge=1)
    sequences_per_step: int = Field(default=8, ge=1)
    max_sequence_tokens: int | None = Field(
        default=None, ge=16, description="a call longer than this (prompt + answer) is skipped"
    )
    micro_batch_tokens: int = Field(default=4096, ge=16)
    row_tokens: int = Field(default=512, ge=16)
    share_prefixes: bool = Field(
        default=True,
        description="run a prefix several sequences of a step share (a harness's system prompt) once; "
        "it needs rows (row_tokens) longer than the shared prefix plus the sequences' own tokens",
    )
    device: str = "auto"
    autocast: Literal["none", "bf16", "auto"] = "none"
    gradient_checkpointing: bool = False
    lora: LoraSection | None = None
    save_every: int = Field(default=0, ge=0, description="steps between numbered checkpoints (0: end only)")

    @field_validator("chat_template_kwargs")
    @classmethod
    def _no_reserved_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        """The names the renderer passes itself (``messages``, ``tools``...) or the template's own
        functions: as the gateway refuses them in a request (a ``TypeError`` traceback otherwise,
        once the model had loaded)."""
        taken = sorted(RESERVED_TEMPLATE_KWARGS.intersection(value))
        if taken:
            raise ValueError(
                f"{', '.join(taken)} cannot be set here: the renderer passes its own "
                f"(reserved: {', '.join(sorted(RESERVED_TEMPLATE_KWARGS))})"
            )
        return value


class SftConfig(Section):
    run: RunSection = Field(default_factory=lambda: RunSection(name="sft"))
    source: SourceSection
    select: SelectSection = Field(default_factory=SelectSection)
    sft: SftSection = Field(default_factory=SftSection)
    optimizer: OptimizerConfig = Field(default_factory=lambda: OptimizerConfig(lr=1e-4))
    metrics: MetricsSection = Field(default_factory=MetricsSection)

    def policy_config(self, total_steps: int) -> PolicyConfig:
        s = self.sft
        return PolicyConfig(
            optimizer=self.optimizer,
            total_steps=total_steps,
            lora=s.lora,
            gradient_checkpointing=s.gradient_checkpointing,
            autocast=s.autocast,
            seed=self.run.seed,
            row_tokens=s.row_tokens,
            share_prefixes=s.share_prefixes,
            device=s.device,
        )
