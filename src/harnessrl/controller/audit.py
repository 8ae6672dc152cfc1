"""Reward-hack audit: scan the commands a rollout's policy issued for known shortcuts.

The SWE-smith experience: agents read the gold patch from ``git log``, fetched upstream code with
``curl``/``pip``, opened sockets from Python, or rewrote the test configuration so that nothing
failed. The sandbox blocks most of this; the audit makes the *attempts* visible (flags per rollout in
the store and dashboard) and can zero the reward of a flagged rollout.

Pure, no I/O. ``extract_commands`` turns recorded calls (OpenAI chat messages with ``tool_calls``,
Anthropic ``tool_use`` blocks, Responses ``output`` items, or text with fenced shell blocks as
mini-swe-agent's text mode uses) into ``CommandRecord``s; ``audit_commands`` applies the rules.

This module is the public API: the records, flags, config and these functions (the rule names and
``CommandRecord``/``extract_commands`` are re-exported here). The pass itself lives here; the
extraction in ``audit_extract``; the rules (shell, git, Python and patch analysis) in
``audit_rules``, installs and writes to tests in ``audit_changes``, those about the machine around
the task (``/proc``, namespaces, the store, paths outside the workspace) in ``audit_system``, shell
syntax in ``audit_shell``. Only this module knows the workspace: ``outside_workspace`` hints for
paths inside it are dropped here. See docs/audit.md.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterator, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

from harnessrl.controller.audit_changes import PACKAGE_INSTALL, TEST_CONFIG_WRITE, check_write
from harnessrl.controller.audit_extract import CommandRecord, extract_commands
from harnessrl.controller.audit_rules import (
    GIT_HISTORY,
    NETWORK_FETCH,
    PYTHON_NETWORK,
    analyze_patch,
    analyze_python,
    analyze_shell,
)
from harnessrl.controller.audit_system import (
    NAMESPACE_ESCAPE,
    OUTSIDE_WORKSPACE,
    PROC_ACCESS,
    STORE_ACCESS,
    check_path,
    raw_hints,
)
from harnessrl.schemas import Call

# The rule names are defined beside their analysis (``audit_rules``, ``audit_changes``, ``audit_system``).
ALL_RULES: tuple[str, ...] = (
    GIT_HISTORY,
    NETWORK_FETCH,
    PACKAGE_INSTALL,
    PYTHON_NETWORK,
    TEST_CONFIG_WRITE,
    PROC_ACCESS,
    NAMESPACE_ESCAPE,
    STORE_ACCESS,
    OUTSIDE_WORKSPACE,
)
# Every rule zeroes the reward by default except ``outside_workspace``: ordinary agents read
# /etc/passwd or list / while orienting themselves, so it is recorded for review, not punished.
ZERO_REWARD_RULES: tuple[str, ...] = tuple(r for r in ALL_RULES if r != OUTSIDE_WORKSPACE)

# The workspace the policy's commands ran in, as one path or several (the host's and a pod's).
Workspace = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]

# Longer texts are cut before analysis so one huge file write cannot stall the controller.
MAX_ANALYZED_CHARS = 200_000


class AuditFlag(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rule: str
    call_seq: int
    command: str
    match: str  # the offending substring of ``command``, for highlighting


class AuditReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    flags: list[AuditFlag] = Field(default_factory=list)
    rules: list[str] = Field(default_factory=list)  # sorted, unique
    commands_checked: int = 0


class AuditConfig(BaseModel):
    """``rules``: which rules to report. ``zero_reward_on``: flagged rules that zero the reward
    (``[]`` to only record flags; every rule but ``outside_workspace`` by default). ``enabled =
    false`` skips the audit entirely."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    rules: tuple[str, ...] = ALL_RULES
    zero_reward_on: tuple[str, ...] = ZERO_REWARD_RULES

    @field_validator("rules", "zero_reward_on")
    @classmethod
    def _known_rules(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(value) - set(ALL_RULES))
        if unknown:
            raise ValueError(f"unknown audit rules {unknown}; known: {list(ALL_RULES)}")
        return value


# ---------------------------------------------------------------------------------------------------
# Audit: records -> flags
# ---------------------------------------------------------------------------------------------------


def audit_commands(
    records: Sequence[CommandRecord], rules: Sequence[str] = ALL_RULES, *, workspace: Workspace | None = None
) -> list[AuditFlag]:
    """Flag every record that matches one of ``rules``; each flag names the offending substring.

    ``workspace``: where the commands ran; ``outside_workspace`` only fires when it is given.
    """
    wanted = set(rules)
    roots = _workspace_roots(workspace)
    flags: list[AuditFlag] = []
    for record in records:
        command = record.command
        hints = [(rule, hint) for rule, hint in _analyze_record(record) if rule in wanted]
        # A path another rule already names (/proc/1/environ, ../harnessrl.db) is not also reported
        # as outside the workspace: the specific rule says more.
        named = {hint for rule, hint in hints if rule != OUTSIDE_WORKSPACE}
        found: dict[tuple[str, str], None] = {}  # ordered and unique
        for rule, hint in hints:
            if rule == OUTSIDE_WORKSPACE and (not roots or hint in named or _is_under(hint, roots)):
                continue
            found.setdefault((rule, _locate(hint, command)), None)
        for rule, match in found:
            if any(r == rule and m != match and match in m for r, m in found):
                continue  # "harnessrl.db" within "../harnessrl.db" says nothing new
            flags.append(AuditFlag(rule=rule, call_seq=record.call_seq, command=command, match=match))
    return flags


def audit_rollout(
    calls: Sequence[Call], config: AuditConfig | None = None, *, workspace: Workspace | None = None
) -> AuditReport:
    """Extract and audit a rollout's commands (an empty report when the audit is disabled).

    ``workspace``: the attempt's workspace (and any other folder the policy may use, such as its
    home), as the harness saw it; without it ``outside_workspace`` cannot fire.
    """
    config = config or AuditConfig()
    if not config.enabled:
        return AuditReport()
    records = extract_commands(calls)
    flags = audit_commands(records, config.rules, workspace=workspace)
    return AuditReport(flags=flags, rules=sorted({f.rule for f in flags}), commands_checked=len(records))


def reward_after_audit(reward: float, report: AuditReport, config: AuditConfig | None = None) -> float:
    """``reward``, or 0.0 when the report has a flag for a rule in ``config.zero_reward_on``."""
    config = config or AuditConfig()
    return 0.0 if config.enabled and set(report.rules) & set(config.zero_reward_on) else reward


def _workspace_roots(workspace: Workspace | None) -> tuple[str, ...]:
    if workspace is None:
        return ()
    paths = [workspace] if isinstance(workspace, (str, os.PathLike)) else list(workspace)
    return tuple(posixpath.normpath(os.path.abspath(os.fspath(p))) for p in paths)


def _is_under(path: str, roots: tuple[str, ...]) -> bool:
    path = posixpath.normpath(path)  # /ws/../../etc/passwd is outside /ws
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _locate(hint: str, command: str) -> str:
    """The substring of ``command`` that best shows ``hint`` (shell unquoting may have changed it)."""
    if hint and hint in command:
        return hint
    parts = hint.split()
    if parts:
        found = re.search(r"[\s'\"\\]+".join(map(re.escape, parts)), command)
        if found:
            return found.group(0)
        for part in sorted(parts, key=len, reverse=True):
            if part in command:
                return part
    return command.strip() or command


def _analyze_record(record: CommandRecord) -> Iterator[tuple[str, str]]:
    text = record.text[:MAX_ANALYZED_CHARS]
    # Raw patterns that count wherever they appear (a path read, a script written, a command).
    for match in _RAW_PATTERNS.finditer(record.command[:MAX_ANALYZED_CHARS]):
        yield (NETWORK_FETCH if match.group("tcp") else GIT_HISTORY), match.group(0)
    yield from raw_hints(record.command[:MAX_ANALYZED_CHARS])
    if record.path is not None:  # a file tool's path, read or written
        yield from check_path(record.path)
    if record.kind == "shell":
        yield from analyze_shell(text, 0)
    elif record.kind == "python":
        yield from analyze_python(text, 0)
    elif record.kind == "patch":
        yield from analyze_patch(text)
    elif record.path is not None and record.kind != "file_read":
        mode = record.kind.removeprefix("file_")
        yield from check_write(record.path, mode, text if mode != "delete" else None)
        if record.path.endswith(".py") and text:
            yield from analyze_python(text, 1)


_RAW_PATTERNS = re.compile(
    r"(?P<tcp>/dev/(?:tcp|udp)/\S*)|\.git/(?:objects|refs|logs|packed-refs|ORIG_HEAD|FETCH_HEAD)\S*"
)
