"""What the audit tests of this folder share: the rules the real audit flags in commands and in a
workspace's changes."""

from __future__ import annotations

from pathlib import Path

from tests.fakes.calls import bash_call

from harnessrl.controller.audit import AuditConfig, AuditReport, CommandRecord, audit_commands, audit_rollout
from harnessrl.controller.audit.workspace import diff_workspace, snapshot_workspace

WORKSPACE = "/rollout/workspace"


def rules_of(*commands: str) -> set[str]:
    """The rules ``audit_rollout`` flags in ``commands``, each a bash tool call of one rollout, in
    order. Every flag must highlight text that was typed (its ``match`` is in its ``command``)."""
    report = audit_rollout([bash_call(command, seq) for seq, command in enumerate(commands)])
    assert all(f.match in f.command for f in report.flags)  # every flag highlights what was typed
    return set(report.rules)


def rules_in(kind: str, text: str) -> set[str]:
    """The rules ``audit_commands`` flags in one command of ``kind`` (``bash``, ``python``, ...);
    every match highlights typed text."""
    flags = audit_commands([CommandRecord(call_seq=0, kind=kind, text=text)], workspace=WORKSPACE)
    assert all(f.match and f.match in f.command for f in flags)
    return {f.rule for f in flags}


def diff_audit(
    tmp_path: Path, before: dict[str, str | bytes], after: dict[str, str | bytes | None]
) -> AuditReport:
    """The audit of a workspace's changes: ``before``'s files snapshotted, then ``after`` written
    (None removes a file); every flag highlights text that is in its file."""
    ws = tmp_path / "ws"
    ws.mkdir(parents=True)
    for name, content in before.items():
        (ws / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    snapshot = snapshot_workspace(ws)
    for name, content in after.items():
        if content is None:
            (ws / name).unlink()
        else:
            (ws / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    report = audit_rollout([], AuditConfig(), workspace=ws, changes=diff_workspace(snapshot, ws))
    assert all(f.match and f.match in f.command for f in report.flags)
    return report
