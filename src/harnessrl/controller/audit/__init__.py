"""Reward-hack audit: scan the commands a rollout's policy issued for known shortcuts.

The SWE-smith experience: agents read the gold patch from ``git log``, fetched upstream code with
``curl``/``pip``, opened sockets from Python, or rewrote the test configuration so that nothing
failed. The sandbox blocks most of this; the audit makes the *attempts* visible (flags per rollout in
the store and dashboard) and can zero the reward of a flagged rollout.

Pure, no I/O. ``extract_commands`` turns recorded calls (OpenAI chat messages with ``tool_calls``,
Anthropic ``tool_use`` blocks, Responses ``output`` items, or text with fenced shell blocks as
mini-swe-agent's text mode uses) into ``CommandRecord``s; ``audit_commands`` applies the rules.

This module is the public API: the records, flags, config and these functions (the rule names and
``CommandRecord``/``extract_commands`` are re-exported here), and ``audit_rollout``, which runs both
passes. The passes live in ``audit.commands`` (the commands) and ``audit.files`` (the workspace
diff), the flag, report, config and time budget in ``audit.report``, and what both passes share
(hints to matches; only the audit knows the workspace: ``outside_workspace`` hints for paths inside
it are dropped there) in ``audit.hints``. The extraction is in ``audit.extract``; the rules (shell,
git, Python and patch analysis) in ``audit.rules``, what a command line or piece of code runs
(runners, interpreters, one-liners, files written then run) in ``audit.invocations``, the shell
Python code runs in ``audit.python_calls``, Python read as it runs in ``audit.python_code``, what
runs a file (suffix, shebang) in ``audit.languages``, the files a
patch touches in ``audit.patches``, the ``.git`` folder read by other programs in ``audit.git_folder``, installs and writes to tests in ``audit.changes``, those about
the machine around the task (``/proc``, namespaces, the store, paths outside the workspace) in
``audit.system``, shell syntax in ``audit.shell`` (``audit.shell_scan``, ``audit.shell_commands``),
code that hides what it runs (``obfuscated_code``) in ``audit.obfuscation``.

The audit reads what ran as well as what was typed: ``audit_files`` applies the same rules to the
workspace diff (``audit.workspace.WorkspaceDiff``: files added, modified and deleted while the harness
ran, with the changed lines of each text file), which the controller computes and hands in as data.
The audit reads the policy's text, so its work is bounded: per piece of text (``MAX_ANALYZED_CHARS``,
``obfuscation.MAX_SINKS``, ``MAX_HINTS_PER_RULE``) and per rollout in time (``AuditConfig.max_seconds``,
checked between commands and between files). What a spent budget leaves unread is flagged
``obfuscated_code``, like every other cap: a cap must not become a hiding place. The controller runs
the audit in a thread nothing can interrupt, outside the harness's timeout, so only these bounds
keep a crafted rollout from holding it (and a controller's shutdown) for minutes.
See docs/audit.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from harnessrl.controller.audit.changes import ALWAYS_EQUAL, FORCED_EXIT, PACKAGE_INSTALL, TEST_CONFIG_WRITE
from harnessrl.controller.audit.commands import MAX_ANALYZED_CHARS, audit_commands
from harnessrl.controller.audit.extract import CommandRecord, extract_commands
from harnessrl.controller.audit.files import audit_files
from harnessrl.controller.audit.hints import MAX_HINTS_PER_RULE, Workspace
from harnessrl.controller.audit.obfuscation import OBFUSCATED_CODE
from harnessrl.controller.audit.patterns import GIT_HISTORY, NETWORK_FETCH, PYTHON_NETWORK
from harnessrl.controller.audit.report import (
    ALL_RULES,
    ZERO_REWARD_RULES,
    AuditBudget,
    AuditConfig,
    AuditFlag,
    AuditReport,
)
from harnessrl.controller.audit.system import NAMESPACE_ESCAPE, OUTSIDE_WORKSPACE, PROC_ACCESS, STORE_ACCESS
from harnessrl.controller.audit.workspace import WorkspaceDiff
from harnessrl.schemas import Call

__all__ = [
    "ALL_RULES",
    "ALWAYS_EQUAL",
    "FORCED_EXIT",
    "GIT_HISTORY",
    "MAX_ANALYZED_CHARS",
    "MAX_FILE_FLAGS",
    "MAX_HINTS_PER_RULE",
    "NAMESPACE_ESCAPE",
    "NETWORK_FETCH",
    "OBFUSCATED_CODE",
    "OUTSIDE_WORKSPACE",
    "PACKAGE_INSTALL",
    "PROC_ACCESS",
    "PYTHON_NETWORK",
    "STORE_ACCESS",
    "TEST_CONFIG_WRITE",
    "ZERO_REWARD_RULES",
    "AuditBudget",
    "AuditConfig",
    "AuditFlag",
    "AuditReport",
    "CommandRecord",
    "Workspace",
    "audit_commands",
    "audit_files",
    "audit_rollout",
    "extract_commands",
    "reward_after_audit",
]

# Flags kept from the workspace diff (a policy that vendors a library into its workspace would
# otherwise store thousands); every rule is still counted, and the report says how many were dropped.
MAX_FILE_FLAGS = 300


def audit_rollout(
    calls: Sequence[Call],
    config: AuditConfig | None = None,
    *,
    workspace: Workspace | None = None,
    changes: WorkspaceDiff | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> AuditReport:
    """Extract and audit a rollout's commands, and the workspace diff when one is given (an empty
    report when the audit is disabled).

    ``workspace``: the attempt's workspace (and any other folder the policy may use, such as its
    home), as the harness saw it; without it ``outside_workspace`` cannot fire. ``changes``: what
    changed in the workspace while the harness ran (``audit.workspace.diff_workspace``).
    """
    config = config or AuditConfig()
    if not config.enabled:
        return AuditReport()
    budget = AuditBudget(config.max_seconds, clock)
    records = extract_commands(calls)
    flags = audit_commands(records, config.rules, workspace=workspace, budget=budget)
    file_flags = (
        audit_files(changes, config.rules, workspace=workspace, budget=budget) if changes is not None else []
    )
    rules = sorted({f.rule for f in flags} | {f.rule for f in file_flags})
    bounds = list(changes.bounds) if changes is not None else []
    if len(file_flags) > MAX_FILE_FLAGS:
        bounds.append(f"{len(file_flags) - MAX_FILE_FLAGS} more workspace flags not listed")
        file_flags = file_flags[:MAX_FILE_FLAGS]
    return AuditReport(
        flags=flags + file_flags,
        rules=rules,
        commands_checked=len(records),
        files_checked=len(changes.changes) if changes is not None else 0,
        workspace_bounds=bounds,
    )


def reward_after_audit(reward: float, report: AuditReport, config: AuditConfig | None = None) -> float:
    """``reward``, or 0.0 when the report has a flag for a rule in ``config.zero_reward_on``."""
    config = config or AuditConfig()
    return 0.0 if config.enabled and set(report.rules) & set(config.zero_reward_on) else reward
