"""The shared vocabulary of harnessrl: runs, tasks, rollouts, attempts, calls, samples, policy versions.

Every component speaks in these types. The words are fixed here once and used everywhere (code,
routes, tables, metrics, docs):

- **run**: one training or evaluation job; owns a folder and a store.
- **task**: one problem given to a harness (free-form JSON, e.g. a prompt and a gold answer).
- **rollout**: one episode of a harness on a task. Has a lifecycle (``RolloutStatus``), and on
  finish an ``Outcome`` and a float reward. Rollouts of one task in one step form a **group**.
- **attempt**: a rollout re-launched after an infrastructure failure keeps its id and bumps
  ``attempt``; calls record the attempt they belong to.
- **call**: one model request the gateway answered for a rollout, with the exact token IDs it
  conditioned on and sampled.
- **sample**: one token sequence for training, built from a chain of calls (``harnessrl.trajectory``).
- **policy version**: an integer bumped by every weight update; every call records the version
  that sampled it.

Records are pydantic models so they serialize the same way to the store, the HTTP API and exports.
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


def now() -> float:
    """Wall-clock seconds since the epoch; the one clock all records use."""
    return time.time()


class RolloutStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Outcome(StrEnum):
    """Why a rollout ended. Only ``INFRA_FAILURE`` is the world's fault, not the policy's."""

    SUCCESS = "success"
    POLICY_FAILURE = "policy_failure"
    INFRA_FAILURE = "infra_failure"
    TIMEOUT = "timeout"


TERMINAL_STATUSES = frozenset({RolloutStatus.FINISHED, RolloutStatus.FAILED, RolloutStatus.CANCELLED})

# The rollout lifecycle. Anything not listed here is an invalid transition.
#   queued  -> running     a controller (or the rollout's first model call) claims it
#   queued  -> finished    finished without ever running (e.g. scored from outside)
#   queued  -> failed      infrastructure failure before launch
#   running -> queued      retry after an infrastructure failure (a new attempt)
#   *       -> cancelled   from any non-terminal state
ROLLOUT_TRANSITIONS: dict[RolloutStatus, frozenset[RolloutStatus]] = {
    RolloutStatus.QUEUED: frozenset(
        {RolloutStatus.RUNNING, RolloutStatus.FINISHED, RolloutStatus.FAILED, RolloutStatus.CANCELLED}
    ),
    RolloutStatus.RUNNING: frozenset(
        {RolloutStatus.QUEUED, RolloutStatus.FINISHED, RolloutStatus.FAILED, RolloutStatus.CANCELLED}
    ),
    RolloutStatus.FINISHED: frozenset(),
    RolloutStatus.FAILED: frozenset(),
    RolloutStatus.CANCELLED: frozenset(),
}


def status_for_outcome(outcome: Outcome) -> RolloutStatus:
    """The terminal status a rollout takes when it ends with ``outcome``."""
    return RolloutStatus.FAILED if outcome is Outcome.INFRA_FAILURE else RolloutStatus.FINISHED


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Run(Record):
    run_id: str
    config: dict[str, Any] = Field(default_factory=dict)
    status: str = "created"
    created_at: float = Field(default_factory=now)


class Task(Record):
    task_id: str
    run_id: str | None = None
    split: str = "train"
    data: dict[str, Any] = Field(default_factory=dict)


class SamplingOverrides(Record):
    """Sampling that a rollout's creator forces on every call of the rollout, whatever the harness
    asks: ``temperature`` and ``top_p`` replace the harness's, ``max_tokens`` caps it. The trainer
    sets them so training calls sample at the temperature its logprobs assume and evaluations run
    greedy. Stored in the rollout's ``metadata["sampling"]`` (the control API's documented field)."""

    temperature: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    max_tokens: int | None = Field(default=None, ge=1, le=2**31 - 1)

    def as_metadata(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class Rollout(Record):
    rollout_id: str
    api_key: str
    run_id: str | None = None
    task_id: str | None = None
    task: dict[str, Any] = Field(default_factory=dict)
    group_id: str | None = None
    step: int | None = None
    status: RolloutStatus = RolloutStatus.QUEUED
    outcome: Outcome | None = None
    reward: float | None = None
    attempt: int = 0
    worker_id: str | None = None
    error: str | None = None
    flags: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: float = Field(default_factory=now)
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def sampling(self) -> SamplingOverrides:
        """The creator's sampling overrides (``metadata["sampling"]``); raises pydantic's
        ``ValidationError`` if they are malformed (the control API refuses those at creation)."""
        return SamplingOverrides.model_validate(self.metadata.get("sampling") or {})


#: The provider API a call came in through (the gateway's routes: docs/gateway.md).
CallApi = Literal["chat.completions", "completions", "messages", "responses"]

#: How the gateway built the prompt of a chat-style call: ``reused`` (an earlier call's sampled
#: tokens spliced in), ``first`` (no earlier call), ``no_match`` (none it continues), ``mismatch``
#: (its history differs from the earlier call's) or ``as_rendered`` (``[gateway] history``).
PromptSource = Literal["reused", "first", "no_match", "mismatch", "as_rendered"]


class Usage(Record):
    prompt_tokens: int
    completion_tokens: int
    #: ``PromptSource``; None for raw completions and calls recorded before it was kept.
    prompt_source: PromptSource | None = None
    reused_prompt_tokens: int = 0  # leading prompt tokens taken verbatim from an earlier call

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Call(Record):
    """One answered model request, token-exact.

    ``prompt_token_ids`` is exactly what the engine conditioned on; ``response_token_ids`` exactly
    what it sampled (including a sampled stop token), with one logprob per sampled token.
    ``request`` is the body as the harness sent it; ``response`` the message the gateway answered
    with (parsed tool calls included), which is how a later call's history is matched to this one.
    """

    rollout_id: str
    seq: int = -1  # position within the rollout; assigned by the store on insert
    attempt: int = 0
    api: CallApi = "chat.completions"
    request: dict[str, Any] = Field(default_factory=dict)
    response: dict[str, Any] = Field(default_factory=dict)
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response_logprobs: list[float]
    policy_version: int = 0
    finish_reason: str = "stop"
    usage: Usage | None = None
    started_at: float = Field(default_factory=now)
    first_token_at: float | None = None
    finished_at: float | None = None
    call_id: str | None = None  # assigned by the store if unset


class ToolRequest(Record):
    """One request a harness's tool made to a tool the gateway serves (the retriever, docs/retrieval.md):
    what was asked and what was answered, per rollout and attempt. Not training data: the policy's
    view of it is the tool output inside its next call's prompt."""

    rollout_id: str
    attempt: int = 0
    tool: str  # "search"
    request: dict[str, Any] = Field(default_factory=dict)
    response: dict[str, Any] = Field(default_factory=dict)
    started_at: float = Field(default_factory=now)
    finished_at: float = Field(default_factory=now)


class PolicyVersion(Record):
    version: int
    step: int | None = None
    checkpoint: str | None = None
    created_at: float = Field(default_factory=now)
    metadata: dict[str, Any] = Field(default_factory=dict)
