"""The audit's pass over the commands a rollout's policy issued (``CommandRecord``s, ``audit.extract``):
each goes through the rules its kind calls for (shell, Python, a patch, a file tool's write) and the
raw patterns that count anywhere, read up to ``MAX_ANALYZED_CHARS`` (the unread tail is flagged)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from harnessrl.controller.audit.changes import check_write
from harnessrl.controller.audit.extract import CommandRecord
from harnessrl.controller.audit.git_folder import git_folder_searched, git_history_path
from harnessrl.controller.audit.hints import RAW_PATTERNS, Workspace, select_hints, workspace_roots
from harnessrl.controller.audit.languages import script_language
from harnessrl.controller.audit.obfuscation import OBFUSCATED_CODE
from harnessrl.controller.audit.patterns import GIT_HISTORY, NETWORK_FETCH
from harnessrl.controller.audit.report import ALL_RULES, AuditBudget, AuditFlag
from harnessrl.controller.audit.rules import analyze_patch, analyze_python, analyze_shell
from harnessrl.controller.audit.system import check_path, raw_hints

# Longer texts are cut before analysis so one huge file write cannot stall the controller; what the
# cut leaves unread is flagged ``obfuscated_code`` (a command padded past the cap hides its tail).
MAX_ANALYZED_CHARS = 200_000
# File tools that search or list a folder (Grep, Glob, search_files, find_file), not one file.
_SEARCH_TOOL = re.compile(r"grep|search|glob|find", re.I)
# Characters of the unread tail a truncation flag shows as its ``match``.
_UNREAD_SHOWN = 80


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
    roots = workspace_roots(workspace)
    flags: list[AuditFlag] = []
    for index, record in enumerate(records):
        if budget is not None and budget.spent():
            if OBFUSCATED_CODE in wanted:
                flags.append(budget.flag(f"{len(records) - index} of {len(records)} commands"))
            break
        command = record.command
        for rule, match in select_hints(_analyze_record(record), command, wanted, roots):
            flags.append(AuditFlag(rule=rule, call_seq=record.call_seq, command=command, match=match))
    return flags


def _analyze_record(record: CommandRecord) -> Iterator[tuple[str, str]]:
    if len(record.command) > MAX_ANALYZED_CHARS or len(record.text) > MAX_ANALYZED_CHARS:
        # A cap must not become a hiding place: the match is where reading stopped.
        yield OBFUSCATED_CODE, record.command[MAX_ANALYZED_CHARS:][:_UNREAD_SHOWN]
    text = record.text[:MAX_ANALYZED_CHARS]
    # Raw patterns that count wherever they appear (a path read, a script written, a command).
    for match in RAW_PATTERNS.finditer(record.command[:MAX_ANALYZED_CHARS]):
        yield (NETWORK_FETCH if match.group("tcp") else GIT_HISTORY), match.group(0)
    yield from raw_hints(record.command[:MAX_ANALYZED_CHARS])
    if record.path is not None:  # a file tool's path, read or written
        yield from check_path(record.path)
        # Read("/repo/.git/COMMIT_EDITMSG"); Grep(path="/repo/.git") reads the whole folder it is given
        searched = record.kind == "file_read" and _SEARCH_TOOL.search(record.tool or "") is not None
        if git_history_path(record.path) or (searched and git_folder_searched(record.path)):
            yield GIT_HISTORY, record.path
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
