"""The audit's vocabulary: the rule names it knows (``ALL_RULES``), a flag and a rollout's report, the
``[controller.audit]`` settings, and the time budget one rollout's audit may spend."""

from __future__ import annotations

import time
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from harnessrl.controller.audit.changes import ALWAYS_EQUAL, FORCED_EXIT, PACKAGE_INSTALL, TEST_CONFIG_WRITE
from harnessrl.controller.audit.obfuscation import OBFUSCATED_CODE
from harnessrl.controller.audit.patterns import GIT_HISTORY, NETWORK_FETCH, PYTHON_NETWORK
from harnessrl.controller.audit.system import NAMESPACE_ESCAPE, OUTSIDE_WORKSPACE, PROC_ACCESS, STORE_ACCESS
from harnessrl.controller.audit.workspace import SnapshotLimits

# The rule names are defined beside their analysis (``audit.rules``, ``audit.changes``, ``audit.system``).
ALL_RULES: tuple[str, ...] = (
    GIT_HISTORY,
    NETWORK_FETCH,
    PACKAGE_INSTALL,
    PYTHON_NETWORK,
    TEST_CONFIG_WRITE,
    PROC_ACCESS,
    NAMESPACE_ESCAPE,
    STORE_ACCESS,
    OBFUSCATED_CODE,
    FORCED_EXIT,
    ALWAYS_EQUAL,
    OUTSIDE_WORKSPACE,
)
# Every rule zeroes the reward by default except ``outside_workspace``: ordinary agents read
# /etc/passwd or list / while orienting themselves, so it is recorded for review, not punished.
ZERO_REWARD_RULES: tuple[str, ...] = tuple(r for r in ALL_RULES if r != OUTSIDE_WORKSPACE)


class AuditFlag(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rule: str
    call_seq: int | None  # the call that issued the command; None for a file in the workspace diff
    command: str
    match: str  # the offending substring of ``command``, for highlighting
    path: str | None = None  # a workspace file the flag is about (relative to the workspace)
    line: int | None = None  # its 1-based line


class AuditReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    flags: list[AuditFlag] = Field(default_factory=list)
    rules: list[str] = Field(default_factory=list)  # sorted, unique
    commands_checked: int = 0
    files_checked: int = 0  # changed files in the workspace diff (None given: 0)
    workspace_bounds: list[str] = Field(default_factory=list)  # caps the diff hit; flags dropped


class AuditConfig(BaseModel):
    """``rules``: which rules to report. ``zero_reward_on``: flagged rules that zero the reward
    (``[]`` to only record flags; every rule but ``outside_workspace`` by default). ``enabled =
    false`` skips the audit entirely. ``workspace_diff``: the controller snapshots the workspace
    before the harness starts and the audit reads the files that changed, within
    ``workspace_limits`` (``false``: commands only, as before the diff existed)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    enabled: bool = True
    rules: tuple[str, ...] = ALL_RULES
    zero_reward_on: tuple[str, ...] = ZERO_REWARD_RULES
    workspace_diff: bool = True
    workspace_limits: SnapshotLimits = Field(default_factory=SnapshotLimits)
    max_seconds: float = Field(
        default=120.0,
        gt=0,
        description="time one rollout's audit may take; what is left unread then is flagged obfuscated_code",
    )

    @property
    def reads_workspace(self) -> bool:
        """Whether the controller should snapshot the workspace for this audit."""
        return self.enabled and self.workspace_diff

    @field_validator("rules", "zero_reward_on")
    @classmethod
    def _known_rules(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(value) - set(ALL_RULES))
        if unknown:
            raise ValueError(f"unknown audit rules {unknown}; known: {list(ALL_RULES)}")
        return value


class AuditBudget:
    """The time one audit may take (``AuditConfig.max_seconds``), read from ``clock`` (a seam for tests)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.seconds = seconds
        self._clock = clock
        self._deadline = clock() + seconds

    def spent(self) -> bool:
        return self._clock() > self._deadline

    def flag(self, what: str) -> AuditFlag:
        """The flag for what the spent budget left unread (``obfuscated_code``: unread text hides)."""
        note = f"audit budget of {self.seconds:g} s spent: {what} not read"
        return AuditFlag(rule=OBFUSCATED_CODE, call_seq=None, command=note, match=note)
