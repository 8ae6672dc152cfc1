"""The gates' rows: the state every gateway of one gate agrees on, and who those gateways are.

A store holds one gate per *name* (``gateway.gate``: a run's own name, ``"default"`` unless set), so
two runs sharing a store (one PostgreSQL for a team, a run and an evaluation) pause, resume and
version their own gateways only. ``gate`` holds one row per name, created by its first command (a
name never commanded reads as open, no version, command 0): paused or open, the live policy
version, and ``command``, a counter every pause or resume of that gate increments in the
transaction that changes the row. Commands are therefore totally ordered by the database (the last
committed one wins), with no clock of our own.

``gateways`` holds one heartbeat row per gateway process, naming its gate: the last command of that
gate it applied (its ack), whether it was quiet then (paused, no call in flight), and a lease it
refreshes. A pause is drained when every gateway *of its gate* whose lease has not expired acked
the pause's command and is quiet (``gateway.control.cluster``). Leases are wall-clock seconds (``time.time()``) of the writing host, so the
hosts' clocks must agree to within a fraction of a lease (NTP does that).

PostgreSQL wakes every listening gateway with ``NOTIFY harnessrl_gate`` in the same transaction
(delivered at commit); ``watch_gate`` is the listening side, on its own connection and thread. Every
payload names its gate (``payload_gate``), so a gateway ignores another gate's commands.
SQLite has no notifications: ``watch_gate`` answers ``None`` and gateways look at the row on a
short timer, which on a local file costs microseconds.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harnessrl.errors import BadRequest, Conflict
from harnessrl.store.codecs import check_ints, check_keys

#: The PostgreSQL notification channel of the gate and the heartbeat rows.
CHANNEL = "harnessrl_gate"
#: Rows whose lease ended this long ago are deleted by the next heartbeat (a SIGKILLed gateway's).
FORGET_AFTER_S = 3600.0
#: The gate of a gateway whose config names none: every such gateway shares it (one run per store).
DEFAULT_GATE = "default"
#: What a gate's name may hold: it travels in notification payloads split on spaces.
GATE_NAME_PATTERN = r"^[A-Za-z0-9._:-]{1,200}$"


def check_gate(gate: str) -> None:
    """``BadRequest`` for a gate name outside ``GATE_NAME_PATTERN``."""
    if not isinstance(gate, str) or re.fullmatch(GATE_NAME_PATTERN, gate) is None:
        shown = gate if not isinstance(gate, str) or len(gate) <= 80 else gate[:80] + "..."
        raise BadRequest(
            f"gate must be 1-200 characters of letters, digits and . _ : -, got {shown!r}", param="gate"
        )


@dataclass(frozen=True, slots=True)
class GateState:
    paused: bool
    policy_version: int | None  # None until a resume announces one
    command: int  # 0: no command yet


@dataclass(frozen=True, slots=True)
class GatewayRow:
    gateway_id: str
    url: str
    command: int  # the last command this gateway applied
    paused: bool  # its gate, as that command left it
    quiet: bool  # paused at ``command`` with no call in flight
    in_flight: int
    waiting: int
    policy_version: int
    lease_until: float
    started_at: float
    gate: str = DEFAULT_GATE  # the gate this gateway serves under

    def live(self, at: float) -> bool:
        return self.lease_until > at


_GATEWAY_COLUMNS = (
    "gateway_id",
    "url",
    "command",
    "paused",
    "quiet",
    "in_flight",
    "waiting",
    "policy_version",
    "lease_until",
    "started_at",
    "gate",
)


class GateRows:
    """The gate's methods of ``SQLStore`` (mixed in; uses its ``_read``/``_write`` and ``PARAM``)."""

    PARAM: str
    ROW_LOCK: str
    #: Whether ``watch_gate`` pushes changes (a server other hosts share) or the caller polls.
    notifies_gate: bool = False

    def _read(self) -> Any: ...  # supplied by the backend
    def _write(self) -> Any: ...

    def _notify_gate(self, conn: Any, payload: str) -> None:
        """Wake the gateways listening (PostgreSQL); nothing to do on SQLite."""

    def watch_gate(self, callback: Callable[[str], None]) -> Callable[[], None] | None:
        """Call ``callback(payload)`` (on another thread) after each commit that changes the gate
        (``command_payload``: the new state itself), a heartbeat's ack (``"ack ID"``) or the members (``"leave ID"``),
        each naming its gate unless it is the default one (``payload_gate``), and with
        ``""`` once listening (or listening again: something may have been missed); returns the
        function that stops it, or ``None`` where the backend cannot notify (SQLite: the caller looks
        at the row on a timer)."""
        return None

    def read_gate(self, gate: str = DEFAULT_GATE) -> GateState:
        check_gate(gate)
        with self._read() as conn:
            return self._gate_on(conn, gate)

    def _gate_on(self, conn: Any, gate: str) -> GateState:
        """The gate's row as ``conn`` sees it (inside the caller's transaction, if any)."""
        return _gate_state(
            conn.execute(
                f"SELECT paused, policy_version, command FROM gate WHERE name = {self.PARAM}", (gate,)
            ).fetchone()
        )

    def command_gate(
        self,
        *,
        paused: bool,
        policy_version: int | None = None,
        rewind: bool = False,
        gate: str = DEFAULT_GATE,
    ) -> GateState:
        """Pause or open the gate ``gate`` as one new command; ``policy_version``: the version live
        from now on. Other gates are untouched.

        ``Conflict`` (and nothing changed) for a version below the live one unless ``rewind``:
        calls recorded under an older label would be trained on as if older weights sampled them.
        """
        check_ints(policy_version=policy_version)
        check_gate(gate)
        p = self.PARAM
        with self._write() as conn:
            # The gate's first command creates its row (open, no version, command 0) to lock it.
            conn.execute(
                "INSERT INTO gate (name, paused, policy_version, command, updated_at) "
                f"VALUES ({p}, 0, NULL, 0, 0) ON CONFLICT (name) DO NOTHING",
                (gate,),
            )
            row = conn.execute(
                f"SELECT paused, policy_version, command FROM gate WHERE name = {p}" + self.ROW_LOCK,
                (gate,),
            ).fetchone()
            current = _gate_state(row)
            if (
                policy_version is not None
                and not rewind
                and current.policy_version is not None
                and policy_version < current.policy_version
            ):
                raise Conflict(
                    f"policy_version {policy_version} is older than the live version "
                    f"({current.policy_version}); versions never go backwards (the gateways stay "
                    "paused; a trainer restoring an older checkpoint passes rewind=true)"
                )
            version = current.policy_version if policy_version is None else policy_version
            state = GateState(paused=paused, policy_version=version, command=current.command + 1)
            conn.execute(
                f"UPDATE gate SET paused = {p}, policy_version = {p}, command = {p}, updated_at = {p} "
                f"WHERE name = {p}",
                (1 if paused else 0, version, state.command, time.time(), gate),
            )
            self._notify_gate(conn, command_payload(state, gate))
        return state

    def beat(self, row: GatewayRow, *, notify: bool) -> None:
        """Insert or refresh a gateway's heartbeat row; ``notify``: its ack changed (wake the waiters)."""
        check_keys(gateway_id=row.gateway_id, url=row.url)
        check_gate(row.gate)
        p = self.PARAM
        columns = ", ".join(_GATEWAY_COLUMNS)
        values = ", ".join([p] * len(_GATEWAY_COLUMNS))
        updates = ", ".join(f"{c} = excluded.{c}" for c in _GATEWAY_COLUMNS[1:])
        with self._write() as conn:
            conn.execute(
                f"INSERT INTO gateways ({columns}) VALUES ({values}) "
                f"ON CONFLICT (gateway_id) DO UPDATE SET {updates}",
                (
                    row.gateway_id,
                    row.url,
                    row.command,
                    1 if row.paused else 0,
                    1 if row.quiet else 0,
                    row.in_flight,
                    row.waiting,
                    row.policy_version,
                    row.lease_until,
                    row.started_at,
                    row.gate,
                ),
            )
            conn.execute(f"DELETE FROM gateways WHERE lease_until < {p}", (time.time() - FORGET_AFTER_S,))
            if notify:
                self._notify_gate(conn, _with_gate(f"ack {row.gateway_id}", row.gate))

    def leave_gate(self, gateway_id: str, gate: str = DEFAULT_GATE) -> None:
        """Remove a gateway's row (it shuts down): nobody waits for it any more."""
        check_keys(gateway_id=gateway_id)
        check_gate(gate)
        with self._write() as conn:
            conn.execute(f"DELETE FROM gateways WHERE gateway_id = {self.PARAM}", (gateway_id,))
            self._notify_gate(conn, _with_gate(f"leave {gateway_id}", gate))

    def list_gateways(self, gate: str = DEFAULT_GATE) -> list[GatewayRow]:
        """Every heartbeat row of ``gate``, live or not (``GatewayRow.live``), oldest first."""
        return self.read_gate_and_gateways(gate)[1]

    def read_gate_and_gateways(self, gate: str = DEFAULT_GATE) -> tuple[GateState, list[GatewayRow]]:
        """``read_gate`` and ``list_gateways`` in one transaction (one round trip for a waiter)."""
        check_gate(gate)
        p = self.PARAM
        with self._read() as conn:
            state = self._gate_on(conn, gate)
            rows = conn.execute(
                f"SELECT {', '.join(_GATEWAY_COLUMNS)} FROM gateways WHERE gate = {p} "
                "ORDER BY started_at, gateway_id",
                (gate,),
            ).fetchall()
        return state, [
            GatewayRow(
                gateway_id=r["gateway_id"],
                url=r["url"],
                command=int(r["command"]),
                paused=bool(r["paused"]),
                quiet=bool(r["quiet"]),
                in_flight=int(r["in_flight"]),
                waiting=int(r["waiting"]),
                policy_version=int(r["policy_version"]),
                lease_until=float(r["lease_until"]),
                started_at=float(r["started_at"]),
                gate=r["gate"],
            )
            for r in rows
        ]


def _gate_state(row: Any) -> GateState:
    if row is None:  # a gate never commanded: open, as a new store's
        return GateState(paused=False, policy_version=None, command=0)
    version = row["policy_version"]
    return GateState(
        paused=bool(row["paused"]),
        policy_version=None if version is None else int(version),
        command=int(row["command"]),
    )


def _with_gate(payload: str, gate: str) -> str:
    """``payload`` naming ``gate`` as its last word; the default gate's payloads name none (as a
    store of one gate always wrote them)."""
    return payload if gate == DEFAULT_GATE else f"{payload} {gate}"


def command_payload(state: GateState, gate: str = DEFAULT_GATE) -> str:
    """The notification of a command: ``"command N paused|open VERSION|- [GATE]"``. It carries the
    state the command committed, so a listener applies it without reading the row back."""
    version = "-" if state.policy_version is None else str(state.policy_version)
    return _with_gate(f"command {state.command} {'paused' if state.paused else 'open'} {version}", gate)


#: Words in a payload before its gate's name: ``command N STATE VERSION`` and ``ack|leave ID``.
_PAYLOAD_WORDS = {"command": 4, "ack": 2, "leave": 2}


def payload_gate(payload: str) -> str | None:
    """The gate a notification is about (``DEFAULT_GATE`` where it names none); ``None`` for ``""``
    (listening again) or a payload of another shape: the listener reads its own gate then."""
    parts = payload.split(" ")
    words = _PAYLOAD_WORDS.get(parts[0])
    if words is None:
        return None
    if len(parts) == words:
        return DEFAULT_GATE
    if len(parts) == words + 1 and parts[-1]:
        return parts[-1]
    return None


def parse_command_payload(payload: str) -> GateState | None:
    """The state in a ``command_payload`` (of any gate: ``payload_gate`` says which); ``None`` for
    any other notification."""
    parts = payload.split(" ")
    if len(parts) not in (4, 5) or parts[0] != "command" or parts[2] not in ("paused", "open"):
        return None
    try:
        version = None if parts[3] == "-" else int(parts[3])
        return GateState(paused=parts[2] == "paused", policy_version=version, command=int(parts[1]))
    except ValueError:
        return None
