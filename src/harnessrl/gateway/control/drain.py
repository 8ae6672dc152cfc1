"""When a pause is drained: the rule ``Cluster.wait_drained`` applies to the gateways' heartbeat rows.

A pause is drained when every live gateway acked the gate's current command (or a newer one) quiet:
paused, with no call in flight (``acked_quiet``). A resume committed meanwhile overtakes it
(``check_not_overtaken``: the trainer must not think the gateways are quiet). A gateway that never
acks is waited for until its lease ends, not past it (``next_look``). This gateway's own row is as of
its last beat, so its counts are taken as they are now (``with_counts``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from harnessrl.errors import Conflict
from harnessrl.store.gate import GateState, GatewayRow


def acked_quiet(row: GatewayRow, command: int) -> bool:
    """Whether ``row``'s gateway applied ``command`` (or a newer one) and had no call in flight."""
    return row.command >= command and row.quiet


def check_not_overtaken(command: int, state: GateState) -> None:
    """``Conflict`` once a resume overtook the pause ``command`` (the gate is open again)."""
    if not state.paused:
        raise Conflict(
            f"pause (command {command}) was overtaken by a resume (command {state.command}); "
            "the gateways are serving: pause again before updating weights"
        )


def next_look(pending: Sequence[GatewayRow], now: float, remaining: float, tick_s: float) -> float:
    """Seconds until the next look at the rows: at the latest when the first pending lease ends."""
    lease_end = min(r.lease_until for r in pending) - now
    return max(0.001, min(remaining, lease_end + 0.001, tick_s))


def with_counts(row: GatewayRow, in_flight: int, waiting: int, quiet: bool) -> GatewayRow:
    """``row`` with its gateway's counts as they are now (``quiet`` only if its row said so too)."""
    return dataclasses.replace(row, in_flight=in_flight, waiting=waiting, quiet=row.quiet and quiet)
