"""Reward-hack audit: scan the commands a rollout's policy issued for known shortcuts.

The SWE-smith experience: agents read the gold patch from ``git log``, fetched upstream code with
``curl``/``pip``, opened sockets from Python, or rewrote the test configuration so that nothing
failed. The sandbox blocks most of this; the audit makes the *attempts* visible (flags per rollout in
the store and dashboard) and can zero the reward of a flagged rollout.

Pure, no I/O. ``extract_commands`` turns recorded calls (OpenAI chat messages with ``tool_calls``,
Anthropic ``tool_use`` blocks, Responses ``output`` items, or text with fenced shell blocks as
mini-swe-agent's text mode uses) into ``CommandRecord``s; ``audit_commands`` applies the rules.

This module is the public API: the records, flags, config and these functions. The rules themselves
(shell, git, Python and patch analysis) are in ``audit_rules``, those about the machine around the
task (``/proc``, namespaces, the store, paths outside the workspace) in ``audit_system``, shell syntax
in ``audit_shell``. Only this module knows the workspace: ``outside_workspace`` hints for paths
inside it are dropped here. See docs/audit.md.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shlex
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from harnessrl.controller.audit_rules import (
    GIT_HISTORY,
    NETWORK_FETCH,
    PACKAGE_INSTALL,
    PYTHON_NETWORK,
    TEST_CONFIG_WRITE,
    analyze_patch,
    analyze_python,
    analyze_shell,
    check_write,
)
from harnessrl.controller.audit_shell import wordlist
from harnessrl.controller.audit_system import (
    NAMESPACE_ESCAPE,
    OUTSIDE_WORKSPACE,
    PROC_ACCESS,
    STORE_ACCESS,
    check_path,
    raw_hints,
)
from harnessrl.schemas import Call

# The rule names are defined beside their analysis in ``audit_rules``/``audit_system``, re-exported here.
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

CommandKind = Literal["shell", "python", "patch", "file_create", "file_edit", "file_delete", "file_read"]

# Longer texts are cut before analysis so one huge file write cannot stall the controller.
MAX_ANALYZED_CHARS = 200_000


class CommandRecord(BaseModel):
    """One action the policy took: a shell command, Python code, a patch, or a file tool use."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    call_seq: int
    kind: CommandKind
    text: str  # the command, code, patch, or the content written (empty for reads and deletes)
    tool: str | None = None  # tool name; None for fenced blocks in text
    path: str | None = None  # file tools only

    @property
    def command(self) -> str:
        """What the dashboard shows; every flag's ``match`` is a substring of it."""
        if self.path is None:
            return self.text
        head = f"{self.tool or self.kind} {self.path}"
        return f"{head}\n{self.text}" if self.text else head


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
# Extraction: recorded calls -> command records
# ---------------------------------------------------------------------------------------------------


_SHELL_KEYS = wordlist("command cmd script commands")
_PATH_KEYS = wordlist("path file_path filepath filename file notebook_path target_file")
_CONTENT_KEYS = wordlist(
    "content file_text text new_str new_string old_str old_string insert_text new_source code_edit"
)
# str_replace_editor (SWE-agent, OpenHands) passes its sub-command in ``command``: not shell.
_EDITOR_SUBCOMMANDS = wordlist(
    "view create str_replace insert undo_edit write append delete edit read replace"
)
_SHELL_TOOL = re.compile(r"bash|shell|terminal|exec|run_command|cmd|console", re.I)
_PYTHON_TOOL = re.compile(r"python|ipython|jupyter|notebook|code_interpreter", re.I)
_FENCE = re.compile(r"```[ \t]*([\w.+-]*)[^\n]*\n(.*?)```", re.S)
_THINK = re.compile(r"<think>.*?</think>", re.S)
_SHELL_LANGS = ("", *wordlist("bash sh shell zsh mswea_bash_command bash_command console"))
_PYTHON_LANGS = wordlist("python py python3 ipython")


def extract_commands(calls: Sequence[Call]) -> list[CommandRecord]:
    """The actions the policy issued, in call order, from each call's answered message."""
    records: list[CommandRecord] = []
    for call in calls:
        for kind, name, payload in _message_parts(call.response):
            if kind == "text":
                records.extend(_records_from_text(call.seq, payload))
            else:
                records.extend(_records_from_tool(call.seq, name, _tool_args(payload)))
    return records


def _message_parts(msg: Any) -> Iterator[tuple[str, str | None, Any]]:
    """Yield ("text", None, str) and ("tool", name, arguments) from any provider's message shape."""
    if not isinstance(msg, dict):
        return
    if isinstance(msg.get("choices"), list):  # a whole chat.completions response was stored
        for choice in msg["choices"]:
            if isinstance(choice, dict):
                yield from _message_parts(choice.get("message"))
    content = msg.get("content")
    if isinstance(content, str):
        yield "text", None, content
    elif isinstance(content, list):
        for block in content:
            yield from _block_parts(block)
    for tool_call in msg.get("tool_calls") or []:
        fn = tool_call.get("function") if isinstance(tool_call, dict) else None
        if isinstance(fn, dict):
            yield "tool", _str_or_none(fn.get("name")), fn.get("arguments")
    if isinstance(msg.get("function_call"), dict):
        yield "tool", _str_or_none(msg["function_call"].get("name")), msg["function_call"].get("arguments")
    if isinstance(msg.get("output"), list):  # Responses API
        for item in msg["output"]:
            yield from _block_parts(item)


def _block_parts(block: Any) -> Iterator[tuple[str, str | None, Any]]:
    if isinstance(block, str):
        yield "text", None, block
        return
    if not isinstance(block, dict):
        return
    kind = block.get("type")
    if kind in ("text", "output_text") and isinstance(block.get("text"), str):
        yield "text", None, block["text"]
    elif kind in ("tool_use", "server_tool_use"):
        yield "tool", _str_or_none(block.get("name")), block.get("input")
    elif kind in ("function_call", "custom_tool_call"):
        yield "tool", _str_or_none(block.get("name")), block.get("arguments", block.get("input"))
    elif kind == "local_shell_call":
        yield "tool", "local_shell", block.get("action")
    elif kind == "message":
        yield from _message_parts(block)
    # thinking / reasoning blocks are not actions


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _tool_args(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except ValueError:
            return {"input": raw}  # free-form tools (Codex apply_patch) or malformed JSON
        return parsed if isinstance(parsed, dict) else {"input": raw}
    return {}


def _records_from_text(seq: int, text: str) -> Iterator[CommandRecord]:
    # Thinking is not executed; only fenced blocks in the visible text are mini-swe-agent actions.
    for match in _FENCE.finditer(_THINK.sub("", text)):
        lang, body = match.group(1).lower(), match.group(2).strip("\n")
        if lang in _SHELL_LANGS:
            yield CommandRecord(call_seq=seq, kind="shell", text=body)
        elif lang in _PYTHON_LANGS:
            yield CommandRecord(call_seq=seq, kind="python", text=body)


def _records_from_tool(seq: int, name: str | None, args: dict[str, Any]) -> Iterator[CommandRecord]:
    tool = name or ""
    path = next((args[k] for k in _PATH_KEYS if isinstance(args.get(k), str)), None)
    sub = args.get("command") if isinstance(args.get("command"), str) else None
    editor_sub = sub.strip().lower() if sub is not None and path is not None else None
    if editor_sub not in _EDITOR_SUBCOMMANDS:
        editor_sub = None
    lang = str(args.get("language") or args.get("lang") or "").lower()

    def make(kind: CommandKind, text: str, with_path: bool = False) -> CommandRecord:
        return CommandRecord(call_seq=seq, kind=kind, text=text, tool=name, path=path if with_path else None)

    for key in _SHELL_KEYS:
        value = args.get(key)
        if editor_sub is not None and key == "command":
            continue
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            # Codex: ["bash", "-lc", "..."] is an argv; a list of whole commands is joined by lines.
            value = shlex.join(value) if not re.search(r"\s", value[0]) else "\n".join(value)
        if isinstance(value, str):
            yield make("shell", value)
    code = args.get("code")
    if isinstance(code, str):
        is_shell = (lang != "" and lang in _SHELL_LANGS) or (
            _SHELL_TOOL.search(tool) and not _PYTHON_TOOL.search(tool)
        )
        yield make("shell" if is_shell else "python", code)
    for key in ("input", "patch", "diff"):
        value = args.get(key)
        if not isinstance(value, str):
            continue
        if key != "input" or "patch" in tool.lower() or _looks_like_patch(value):
            yield make("patch", value)
        else:
            yield make("python" if _PYTHON_TOOL.search(tool) else "shell", value)
    if path is None:
        return
    lowered = tool.lower()
    texts = [args[k] for k in _CONTENT_KEYS if isinstance(args.get(k), str)]
    edits = args.get("edits")
    for edit in edits if isinstance(edits, list) else []:  # Claude Code MultiEdit
        if isinstance(edit, dict):
            texts += [v for k, v in edit.items() if k in _CONTENT_KEYS and isinstance(v, str)]
    kind: CommandKind
    if editor_sub == "delete" or re.search(r"delete|remove|unlink", lowered):
        kind = "file_delete"
    elif editor_sub in ("view", "read"):
        kind = "file_read"
    elif editor_sub in ("create", "write"):
        kind = "file_create"
    elif editor_sub is not None or re.search(r"edit|replace|insert|append|patch", lowered):
        kind = "file_edit"
    elif texts:
        kind = "file_edit" if any(k.startswith("old_") for k in args) else "file_create"
    elif not any(isinstance(args.get(k), str) for k in (*_SHELL_KEYS, "code", "input")):
        kind = "file_read"  # Read / view / grep tools; a shell tool's ``path`` is only its cwd
    else:
        return
    yield make(kind, "\n".join(texts) if kind in ("file_create", "file_edit") else "", True)


def _looks_like_patch(text: str) -> bool:
    return text.lstrip().startswith(("*** Begin Patch", "diff --git", "--- ")) or "\n+++ " in text


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
