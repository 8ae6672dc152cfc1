"""The ``Store`` protocol: the durable record of runs, tasks, rollouts, calls and policy versions.

Every implementation (SQLite now, PostgreSQL later) passes the same contract tests in
``tests/store/``. Rules every implementation keeps:

- A method returns only after its write is durable against a process crash (SIGKILL).
- Rollout status changes follow ``harnessrl.schemas.ROLLOUT_TRANSITIONS``; anything else raises
  ``InvalidTransition``. Unknown ids raise ``NotFound``.
- ``add_call`` assigns ``seq`` atomically (0, 1, 2, ... per rollout), so calls keep their order
  even when several gateway workers write for one rollout.
- A call reads back equal to the call added (with its ``seq`` and ``call_id``), however it is
  stored: the SQL stores keep each call as a delta on earlier calls of its attempt (``chains``).
- ``claim_rollouts`` moves queued rollouts to running atomically: two claimers never get the same one.
- A rollout that ended (finished, failed, cancelled) takes no more calls, nor does an attempt that a
  requeue superseded: ``add_call`` raises ``RolloutEnded``, decided under the lock the ending write
  takes, so every call is either recorded before the end or refused (docs/store.md).
- Text no backend can store as given (a NUL, a lone surrogate) gets the same answer on every
  backend: free text (an ``error``) is stored with it escaped (``codecs.storable_text``), so the
  write succeeds; a name or id holding it raises ``BadRequest`` (``codecs.check_keys``).
- An integer past 64 bits raises ``BadRequest`` naming its field (``codecs.check_ints``), and a
  ``call_id`` already recorded ``Conflict``, the same on every backend.
- Methods are thread-safe; async callers run them in a worker thread when latency matters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from harnessrl.errors import InvalidTransition
from harnessrl.schemas import Call, Outcome, PolicyVersion, Rollout, RolloutStatus, Run, Task, ToolRequest
from harnessrl.store.gate import DEFAULT_GATE

if TYPE_CHECKING:
    from harnessrl.store.chains import EncodedItems
    from harnessrl.store.gate import GateState, GatewayRow

#: The rollout metadata key under which ``count_dropped_call`` counts the calls a gateway dropped
#: (never recorded) per reason: ``{"client_gone": 2, "rollout_ended": 1, ...}``.
DROPPED_CALLS_KEY = "dropped_calls"

#: Why a gateway drops a call (``harnessrl.gateway.pipeline.delivery``): its client left, its client read
#: too slowly, its rollout (or attempt) ended before it was recorded, the gateway stalled past its
#: lease while the call generated (``gateway.control.heartbeat``'s fence), or the gateway began to
#: shut down while the call waited at the pause gate.
DROP_REASONS = ("client_gone", "slow_reader", "rollout_ended", "gateway_lapsed", "gateway_stopping")


class RolloutEnded(InvalidTransition):
    """A call for a rollout (or attempt) that has ended: it is not recorded."""


@runtime_checkable
class Store(Protocol):
    # -- runs -------------------------------------------------------------------------------------
    @property
    def local_file(self) -> Path | None:
        """The database file, when the store is a file on this machine (SQLite); else ``None``
        (PostgreSQL, an in-memory SQLite). The dashboard opens it read-only."""

    @property
    def reads_at_once(self) -> bool:
        """Whether ``get_rollout_by_key`` and ``read_gate`` answer from this machine in microseconds,
        never waiting for another thread's transaction (SQLite in WAL mode, on its own connection per
        thread): an event loop may call them directly instead of handing them to a thread (the
        gateway does: the key once per model call, the gate on its poll). False for a server's
        database (PostgreSQL: a network round trip)."""

    def create_run(self, run_id: str, config: dict[str, Any] | None = None) -> Run:
        """Create a run, or return the existing one with that id (idempotent)."""

    def get_run(self, run_id: str) -> Run: ...

    def list_runs(self) -> list[Run]: ...

    def set_run_status(self, run_id: str, status: str) -> None: ...

    # -- tasks ------------------------------------------------------------------------------------
    def add_tasks(self, tasks: Sequence[Task]) -> None:
        """Insert tasks; an existing ``task_id`` is left as it is."""

    def get_task(self, task_id: str) -> Task: ...

    def list_tasks(self, run_id: str | None = None, split: str | None = None) -> list[Task]: ...

    # -- rollouts ---------------------------------------------------------------------------------
    def create_rollout(
        self,
        *,
        rollout_id: str | None = None,
        task: dict[str, Any] | None = None,
        run_id: str | None = None,
        task_id: str | None = None,
        group_id: str | None = None,
        step: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Rollout:
        """Create a queued rollout with a fresh api key. Idempotent for a given ``rollout_id``:
        a second call returns the stored rollout unchanged (same key)."""

    def get_rollout(self, rollout_id: str) -> Rollout: ...

    def get_rollout_by_key(self, api_key: str) -> Rollout:
        """The rollout owning this api key; ``NotFound`` if none."""

    def list_rollouts(
        self,
        *,
        run_id: str | None = None,
        status: RolloutStatus | Sequence[RolloutStatus] | None = None,
        step: int | None = None,
        group_id: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Rollout]:
        """Rollouts in creation order, filtered."""

    def count_rollouts(
        self,
        *,
        run_id: str | None = None,
        status: RolloutStatus | Sequence[RolloutStatus] | None = None,
        step: int | None = None,
    ) -> int: ...

    def claim_rollouts(self, worker_id: str, limit: int, *, run_id: str | None = None) -> list[Rollout]:
        """Atomically move up to ``limit`` queued rollouts (oldest first) to running for this worker.
        Rollouts an earlier claim of this worker (through this store object) took although its
        COMMIT got no answer (an ``UpstreamError``) are handed out first."""

    def start_rollout(self, rollout_id: str, *, attempt: int | None = None) -> Rollout:
        """queued -> running (e.g. on its first model call); a running rollout is returned unchanged.
        ``attempt``: the attempt the caller's key opened; ``RolloutEnded`` if a requeue superseded it
        (the gateway passes it: a stale key must not start the next attempt with no worker)."""

    def finish_rollout(
        self,
        rollout_id: str,
        outcome: Outcome,
        reward: float,
        *,
        error: str | None = None,
        metadata: dict[str, Any] | None = None,
        attempt: int | None = None,
    ) -> Rollout:
        """End a rollout with an outcome and reward (finished, or failed for an infra failure).
        ``metadata`` is merged into the rollout's metadata (e.g. evaluator output). A reward that is
        not finite raises ``BadRequest`` and changes nothing. ``attempt``: the attempt whose result
        this is; ``RolloutEnded`` if a requeue superseded it (a controller passes it)."""

    def void_rollout(
        self, rollout_id: str, *, flag: str, error: str, metadata: dict[str, Any] | None = None
    ) -> Rollout:
        """A finished rollout whose result cannot be trusted (it was finished by someone other than its
        controller): reward 0, outcome ``policy_failure``, ``flag`` added to its flags, ``error`` set.
        ``metadata``, when given, replaces the rollout's: what the untrusted finish merged in (a
        ``calls_seen`` of 0, a mark that leaves it out of training) must not outlive its reward."""

    def requeue_rollout(
        self, rollout_id: str, *, error: str | None = None, attempt: int | None = None
    ) -> Rollout:
        """running -> queued with ``attempt + 1`` (retry after an infrastructure failure) and a new
        ``api_key``: the ended attempt's key opens nothing any more. ``attempt``: as for
        ``finish_rollout``."""

    def cancel_rollout(self, rollout_id: str, *, attempt: int | None = None) -> Rollout:
        """queued or running -> cancelled (its controller kills the harness). ``attempt``: the
        attempt the caller read; ``RolloutEnded`` if a requeue superseded it (its fresh attempt is
        not the caller's to cancel)."""
        ...

    def fail_unreadable_rollout(self, rollout_id: str, *, attempt: int | None = None) -> bool:
        """End a queued or running rollout whose row cannot be read (``RolloutUnreadable``) failed
        (``infra_failure``) without decoding it; False where it reads whole, ended, or moved past
        ``attempt``."""
        ...

    def set_rollout_flags(self, rollout_id: str, flags: Sequence[str]) -> None: ...

    def update_rollout_metadata(self, rollout_id: str, metadata: dict[str, Any]) -> Rollout:
        """Merge keys into the rollout's metadata."""

    def count_dropped_call(self, rollout_id: str, reason: str) -> Rollout:
        """Add one to ``metadata["dropped_calls"][reason]`` (atomically, whatever the rollout's status):
        a model call of this rollout that a gateway cancelled and did not record (its client left,
        read too slowly, or the rollout ended first). The trainer reports these per step."""

    def watch_rollout_ends(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(rollout_id)`` after every commit, through this store object, that ends a
        rollout or an attempt of it (finish, cancel, requeue; void too); returns a function that
        stops the calls. In-process only (other processes' writes are not seen)."""

    # -- calls ------------------------------------------------------------------------------------
    def add_call(self, call: Call, encoded: EncodedItems | None = None) -> Call:
        """Durably append a call to its rollout; returns it with ``seq`` and ``call_id`` set.
        ``RolloutEnded`` if the rollout ended or ``call.attempt`` is older than its attempt.
        ``encoded``: its request's history items as the caller already encoded them (a shortcut,
        ``store.chains.EncodedItems``)."""

    def add_call_now(self, call: Call, encoded: EncodedItems | None = None) -> Call | None:
        """``add_call``, if it can be done this moment without waiting for anything (another
        writer's lock, a server); else ``None``, having done nothing. An event loop may call it: the
        gateway writes a call this way when nothing else is being written (a hop to its writer
        thread and back cost more than the write), and hands it to that thread otherwise.
        Always ``None`` for a server's database (PostgreSQL)."""

    def add_calls(
        self, calls: Sequence[Call], encoded: Sequence[EncodedItems | None] | None = None
    ) -> list[Call | Exception]:
        """``add_call`` for several calls in one transaction (the gateway's group commit): one
        result per call, a call that cannot be added gets its exception in its place and fails
        alone; raises only if the commit itself fails (then none was added)."""

    def list_calls(self, rollout_id: str, *, attempt: int | None = None) -> list[Call]:
        """The rollout's calls in ``seq`` order (all attempts unless one is given)."""

    def count_calls(self, rollout_id: str | None = None) -> int: ...

    # -- policy versions --------------------------------------------------------------------------
    def add_policy_version(self, version: PolicyVersion) -> None: ...

    def latest_policy_version(self) -> PolicyVersion | None: ...

    def list_policy_versions(self) -> list[PolicyVersion]: ...

    # -- tool requests (the retriever's query log) -----------------------------------------------
    def add_tool_request(self, request: ToolRequest) -> None:
        """Record one request to a gateway-served tool (``schemas.ToolRequest``), durably; ``RolloutEnded``
        if its rollout ended or its attempt was superseded (as ``add_call``)."""

    def list_tool_requests(self, rollout_id: str, *, attempt: int | None = None) -> list[ToolRequest]:
        """The rollout's tool requests in arrival order (all attempts unless one is given)."""

    def count_tool_requests(self, rollout_id: str, *, attempt: int | None = None) -> int:
        """How many tool requests the rollout has (all attempts unless one is given), none of them
        read: what the search budget counts from."""

    # -- lifecycle --------------------------------------------------------------------------------
    # -- the gate shared by the gateways (``store.gate``) -------------------------------------------
    notifies_gate: bool  # whether ``watch_gate`` pushes changes (PostgreSQL) or callers poll (SQLite)

    def read_gate(self, gate: str = DEFAULT_GATE) -> GateState: ...

    def command_gate(
        self,
        *,
        paused: bool,
        policy_version: int | None = None,
        rewind: bool = False,
        gate: str = DEFAULT_GATE,
    ) -> GateState:
        """Pause or open the gate ``gate`` as one new command (``Conflict`` for a version going
        backwards); other gates are untouched."""
        ...

    def beat(self, row: GatewayRow, *, notify: bool) -> None: ...

    def leave_gate(self, gateway_id: str, gate: str = DEFAULT_GATE) -> None: ...

    def list_gateways(self, gate: str = DEFAULT_GATE) -> list[GatewayRow]: ...

    def read_gate_and_gateways(self, gate: str = DEFAULT_GATE) -> tuple[GateState, list[GatewayRow]]: ...

    def watch_gate(self, callback: Callable[[str], None]) -> Callable[[], None] | None:
        """Notify ``callback(payload)`` of gate, ack and member changes; ``None`` where the backend
        cannot (the caller polls)."""
        ...

    def close(self) -> None: ...
