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
extraction in ``audit.extract``; the rules (shell, git, Python and patch analysis) in
``audit.rules``, what a command line or piece of code runs (runners, interpreters, one-liners, files
written then run) in ``audit.invocations``, the files a patch touches in ``audit.patches``, installs and writes to tests in ``audit.changes``, those about the machine around
the task (``/proc``, namespaces, the store, paths outside the workspace) in ``audit.system``, shell
syntax in ``audit.shell``, code that hides what it runs (``obfuscated_code``) in
``audit.obfuscation``. Only this module knows the workspace: ``outside_workspace`` hints for paths
inside it are dropped here.

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

import os
import posixpath
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

from harnessrl.controller.audit.changes import (
    ALWAYS_EQUAL,
    FORCED_EXIT,
    PACKAGE_INSTALL,
    TEST_CONFIG_WRITE,
    check_write,
)
from harnessrl.controller.audit.extract import CommandRecord, extract_commands
from harnessrl.controller.audit.obfuscation import OBFUSCATED_CODE
from harnessrl.controller.audit.rules import (
    GIT_HISTORY,
    NETWORK_FETCH,
    PYTHON_NETWORK,
    analyze_patch,
    analyze_python,
    analyze_shell,
)
from harnessrl.controller.audit.system import (
    NAMESPACE_ESCAPE,
    OUTSIDE_WORKSPACE,
    PROC_ACCESS,
    STORE_ACCESS,
    check_path,
    raw_hints,
)
from harnessrl.controller.audit.workspace import (
    FileChange,
    SnapshotLimits,
    WorkspaceDiff,
    is_code_path,
    script_language,
)
from harnessrl.schemas import Call

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

# The workspace the policy's commands ran in, as one path or several (the host's and a pod's).
Workspace = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]

# Longer texts are cut before analysis so one huge file write cannot stall the controller; what the
# cut leaves unread is flagged ``obfuscated_code`` (a command padded past the cap hides its tail).
MAX_ANALYZED_CHARS = 200_000
# Characters of the unread tail a truncation flag shows as its ``match``.
_UNREAD_SHOWN = 80
# Flags kept from the workspace diff (a policy that vendors a library into its workspace would
# otherwise store thousands); every rule is still counted, and the report says how many were dropped.
MAX_FILE_FLAGS = 300
# Distinct hints of one rule kept per piece of text: each is located in the text and compared with the
# others, so a text of 20,000 distinct /proc paths would otherwise cost minutes (the rule is flagged
# either way).
MAX_HINTS_PER_RULE = 50


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


# ---------------------------------------------------------------------------------------------------
# Audit: records -> flags
# ---------------------------------------------------------------------------------------------------


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


def audit_commands(
    records: Sequence[CommandRecord],
    rules: Sequence[str] = ALL_RULES,
    *,
    workspace: Workspace | None = None,
    budget: AuditBudget | None = None,
) -> list[AuditFlag]:
    """Flag every record that matches one of ``rules``; each flag names the offending substring.

    ``workspace``: where the commands ran; ``outside_workspace`` only fires when it is given.
    ``budget``: checked before each record; once spent, the rest is flagged unread (``obfuscated_code``).
    """
    wanted = set(rules)
    roots = _workspace_roots(workspace)
    flags: list[AuditFlag] = []
    for index, record in enumerate(records):
        if budget is not None and budget.spent():
            if OBFUSCATED_CODE in wanted:
                flags.append(budget.flag(f"{len(records) - index} of {len(records)} commands"))
            break
        command = record.command
        for rule, match in _select(_analyze_record(record), command, wanted, roots):
            flags.append(AuditFlag(rule=rule, call_seq=record.call_seq, command=command, match=match))
    return flags


def _select(
    hints: Iterable[tuple[str, str]], text: str, wanted: set[str], roots: tuple[str, ...]
) -> list[tuple[str, str]]:
    """The ``(rule, match)`` pairs worth a flag, each ``match`` a substring of ``text``, in order."""
    unique: dict[tuple[str, str], None] = {}  # in order; each rule's first MAX_HINTS_PER_RULE distinct hints
    per_rule: dict[str, int] = {}
    for rule, hint in hints:
        if rule in wanted and (rule, hint) not in unique and per_rule.get(rule, 0) < MAX_HINTS_PER_RULE:
            unique[(rule, hint)] = None
            per_rule[rule] = per_rule.get(rule, 0) + 1
    hints = list(unique)
    # A path another rule already names (/proc/1/environ, ../harnessrl.db) is not also reported
    # as outside the workspace: the specific rule says more.
    named = {hint for rule, hint in hints if rule != OUTSIDE_WORKSPACE}
    found: dict[tuple[str, str], None] = {}  # ordered and unique
    for rule, hint in hints:
        if rule == OUTSIDE_WORKSPACE and (not roots or hint in named or _is_under(hint, roots)):
            continue
        found.setdefault((rule, _locate(hint, text)), None)
    # "harnessrl.db" within "../harnessrl.db" says nothing new
    return [
        (rule, match)
        for rule, match in found
        if not any(r == rule and m != match and match in m for r, m in found)
    ]


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
    if len(record.command) > MAX_ANALYZED_CHARS or len(record.text) > MAX_ANALYZED_CHARS:
        # A cap must not become a hiding place: the match is where reading stopped.
        yield OBFUSCATED_CODE, record.command[MAX_ANALYZED_CHARS:][:_UNREAD_SHOWN]
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
        # existed=False: whether the file was there before the harness ran is the diff's to say (a
        # reproduction script the policy wrote may be edited and removed).
        yield from check_write(record.path, mode, text if mode != "delete" else None, existed=False)
        language = script_language(record.path, text.split("\n", 1)[0]) if text else None
        if language == "python":
            yield from analyze_python(text, 1)
        elif language == "shell":
            yield from analyze_shell(text, 1)


_RAW_PATTERNS = re.compile(
    r"(?P<tcp>/dev/(?:tcp|udp)/\S*)|\.git/(?:objects|refs|logs|packed-refs|ORIG_HEAD|FETCH_HEAD)\S*"
)


# ---------------------------------------------------------------------------------------------------
# Audit: the workspace diff -> flags
# ---------------------------------------------------------------------------------------------------

# Files tools write for themselves (caches, installed packages): not writes of tests or their config.
_GENERATED = re.compile(
    r"(?:^|/)(?:__pycache__|\.pytest_cache|\.mypy_cache|\.ruff_cache|\.hypothesis|node_modules"
    r"|site-packages|dist-packages|\.tox|\.nox)(?:/|$)|\.py[co]$"
)
_EXCERPT_CONTEXT = 300  # characters either side of a match within its line
_MODES = {"added": "create", "modified": "edit", "deleted": "delete"}


def audit_files(
    changes: WorkspaceDiff,
    rules: Sequence[str] = ALL_RULES,
    *,
    workspace: Workspace | None = None,
    budget: AuditBudget | None = None,
) -> list[AuditFlag]:
    """Flag what the policy left in its workspace: the changed lines of each text file go through
    the rules its kind calls for (Python, shell, or the raw patterns for any text), added, changed
    and deleted paths through the write rules, symlink targets through the path rules, and binary
    modules that would be imported instead of source through ``obfuscated_code``. Files the task
    shipped and the harness did not change are not in ``changes`` and are not audited."""
    wanted = set(rules)
    roots = _workspace_roots(workspace)
    flags: list[AuditFlag] = []
    if changes.grew_past_bounds and OBFUSCATED_CODE in wanted:
        # The task's workspace fit the walk and the policy's did not: what it hid past the cap is unread.
        note = next((b for b in changes.bounds if "walk stopped" in b), "walk stopped")
        flags.append(AuditFlag(rule=OBFUSCATED_CODE, call_seq=None, command=f"workspace: {note}", match=note))
    for index, change in enumerate(changes.changes):
        if budget is not None and budget.spent():
            if OBFUSCATED_CODE in wanted:
                flags.append(
                    budget.flag(f"{len(changes.changes) - index} of {len(changes.changes)} changed files")
                )
            break
        flags.extend(_file_flags(change, wanted, roots))
    return flags


def _file_flags(change: FileChange, wanted: set[str], roots: tuple[str, ...]) -> Iterator[AuditFlag]:
    path, head = change.path, f"{change.status} {change.path}"

    def flag(rule: str, command: str, match: str, line: int | None = None) -> AuditFlag:
        return AuditFlag(rule=rule, call_seq=None, command=command, match=match, path=path, line=line)

    text = "\n".join(h.text for h in change.hunks) if change.hunks else ""
    writes = [] if _GENERATED.search(path) else list(check_write(path, _MODES[change.status], text or None))
    if change.kind == "symlink" and change.target is not None:
        command = f"{head} -> {change.target}"
        hints = [
            *writes,
            *raw_hints(change.target),
            *check_path(change.target),
            *_escaping(path, change.target),
        ]
        for rule, match in _select(hints, command, wanted, roots):
            yield flag(rule, command, match)
        return
    if change.shadows is not None and OBFUSCATED_CODE in wanted:
        command = f"{head}: a binary module imported instead of {change.shadows}"
        yield flag(OBFUSCATED_CODE, command, path)
    unread = change.hunks is None and change.note and change.status != "deleted" and is_code_path(path)
    if unread and OBFUSCATED_CODE in wanted:  # code the audit could not read (padded past the cap, say)
        yield flag(OBFUSCATED_CODE, f"{head}: {change.note}", path)
    for rule, match in _select(writes, head, wanted, roots):
        yield flag(rule, head, match)
    if not text:
        return
    hints: list[tuple[str, str]] = []  # ``text`` is bounded by the diff's limits (max_text_bytes)
    for match in _RAW_PATTERNS.finditer(text):
        hints.append((NETWORK_FETCH if match.group("tcp") else GIT_HISTORY, match.group(0)))
    hints.extend(raw_hints(text))
    first = change.hunks[0] if change.hunks else None
    shebang = first.text if first is not None and first.start == 1 else ""
    # The file's own first line (kept by the snapshot): lines appended to a shipped script are read
    # as what runs it, though no hunk starts at line 1.
    language = script_language(path, change.first_line if change.first_line is not None else shebang)
    if language == "python":
        hints.extend(analyze_python(text, 1))
    elif language == "shell":
        hints.extend(analyze_shell(text, 1))
    lines = [n for h in change.hunks or () for n in range(h.start, h.start + h.text.count("\n") + 1)]
    for rule, match in _select(hints, text, wanted, roots):
        index, excerpt, shown = _excerpt(text, match)
        line = lines[index] if index < len(lines) else None
        yield flag(rule, f"{head}, line {line}:\n{excerpt}", shown, line)


def _escaping(path: str, target: str) -> Iterator[tuple[str, str]]:
    """A relative symlink target that climbs out of the workspace (absolute ones are paths already)."""
    if not target.startswith("/"):
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
        if resolved == ".." or resolved.startswith("../"):
            yield OUTSIDE_WORKSPACE, target


def _excerpt(text: str, match: str) -> tuple[int, str, str]:
    """(line index of ``match`` in ``text``, the text around it on its lines, ``match`` as shown)."""
    at = text.find(match)
    if at < 0:  # _locate found nothing better than the whole text
        first = text.split("\n", 1)[0][: 2 * _EXCERPT_CONTEXT]
        return 0, first, first
    shown = match if len(match) <= 2 * _EXCERPT_CONTEXT else match[: 2 * _EXCERPT_CONTEXT]
    start = max(text.rfind("\n", 0, at) + 1, at - _EXCERPT_CONTEXT)
    end = text.find("\n", at + len(shown))
    end = min(len(text) if end < 0 else end, at + len(shown) + _EXCERPT_CONTEXT)
    return text.count("\n", 0, at), text[start:end], shown
