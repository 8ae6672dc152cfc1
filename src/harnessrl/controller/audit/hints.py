"""From the ``(rule, hint)`` pairs the analysers yield to the matches worth a flag, shared by the
commands' pass (``audit.commands``) and the workspace diff's (``audit.files``): each rule's distinct
hints (at most ``MAX_HINTS_PER_RULE``), ``outside_workspace`` dropped for paths inside the workspace
(only the audit knows it), and each hint located in the text it came from, for highlighting."""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterable, Sequence

from harnessrl.controller.audit.system import OUTSIDE_WORKSPACE

# The workspace the policy's commands ran in, as one path or several (the host's and a pod's).
Workspace = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]

# Distinct hints of one rule kept per piece of text: each is located in the text and compared with the
# others, so a text of 20,000 distinct /proc paths would otherwise cost minutes (the rule is flagged
# either way).
MAX_HINTS_PER_RULE = 50

# Raw patterns that count wherever they appear (a path read, a script written, a command).
RAW_PATTERNS = re.compile(
    r"(?P<tcp>/dev/(?:tcp|udp)/\S*)|\.git/(?:objects|refs|logs|packed-refs|ORIG_HEAD|FETCH_HEAD)\S*"
)


def select_hints(
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


def workspace_roots(workspace: Workspace | None) -> tuple[str, ...]:
    """The workspace's folders as normalised absolute paths (none: ``outside_workspace`` cannot fire)."""
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
