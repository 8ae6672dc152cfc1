"""What the audit tests of this folder share: the rules the real audit flags in shell commands."""

from __future__ import annotations

from tests.fakes.calls import bash_call

from harnessrl.controller.audit import audit_rollout


def rules_of(*commands: str) -> set[str]:
    """The rules ``audit_rollout`` flags in ``commands``, each a bash tool call of one rollout, in
    order. Every flag must highlight text that was typed (its ``match`` is in its ``command``)."""
    report = audit_rollout([bash_call(command, seq) for seq, command in enumerate(commands)])
    assert all(f.match in f.command for f in report.flags)  # every flag highlights what was typed
    return set(report.rules)
