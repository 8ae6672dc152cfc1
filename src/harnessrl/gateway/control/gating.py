"""Pausing and resuming every gateway of this gateway's gate (``gateway.gate``): one implementation, two doors.

The control API (``POST /api/pause``, ``/api/resume``) and a trainer in the same process
(``GatewayHandle``) run the same two functions, so a trainer that hosts its gateway and one that
drives gateways over HTTP pause, drain and version them identically. Both commit the command in the
store's gate and wait on the other gateways' acks there (``gateway.control.cluster``): any gateway can take
the command, and no gateway needs to know another's address.

``GatewayHandle`` is how code on another event loop (the trainer's) reaches a gateway served in a
background thread (``serve_in_thread``): the gate's futures and the engine's HTTP clients belong to
the gateway's loop, so everything the handle does is scheduled there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from harnessrl.engines.base import Engine, WeightUpdate
from harnessrl.errors import BadRequest, Conflict
from harnessrl.gateway.control.cluster import Cluster
from harnessrl.gateway.control.drain import acked_quiet
from harnessrl.gateway.json_input import INT64_MAX
from harnessrl.gateway.state import GatewayState
from harnessrl.store.gate import GatewayRow

T = TypeVar("T")
log = logging.getLogger("harnessrl.gateway")

#: Seconds a resume waits for the gateways to apply it (at most ``gateway.pause_timeout_s``): well
#: inside a client's timeout, however long the leases are; a live gateway applies it in milliseconds.
RESUME_APPLY_WAIT_S = 10.0


def gateway_state_json(state: GatewayState) -> dict[str, Any]:
    """What this gateway process reports of itself (``/api/state`` adds the gate and its members)."""
    return {
        "paused": state.gate.paused,
        "in_flight": state.gate.in_flight,
        "waiting": state.gate.waiting,
        "model": state.engine.model_name,
        "policy_version": state.engine.policy_version,
        "context_length": state.engine.context_length,
        "uptime_s": round(state.uptime(), 3),
        "gateway_id": state.cluster.gateway_id,
        "gate": state.cluster.gate_name,  # the store's gate this gateway serves under (``gateway.gate``)
        "command": state.cluster.applied,  # the last pause/resume this gateway applied
    }


def row_json(cluster: Cluster, row: GatewayRow, command: int) -> dict[str, Any]:
    """One live gateway as ``/api/state`` and a pause's answer list it (``command``: the gate's)."""
    return {
        "gateway_id": row.gateway_id,
        "url": row.url,
        "self": row.gateway_id == cluster.gateway_id,
        "command": row.command,
        "paused": row.paused,
        "drained": acked_quiet(row, command),
        "in_flight": row.in_flight,
        "waiting": row.waiting,
        "policy_version": row.policy_version,
        "lease_s": round(max(0.0, row.lease_until - cluster.clock()), 3),
    }


async def cluster_state_json(state: GatewayState) -> dict[str, Any]:
    """``/api/state``: the gate as the store has it, totals over the live gateways, and each of them."""
    gate, live = await state.cluster.members()
    state.cluster.apply(gate)
    return {
        **gateway_state_json(state),
        "paused": gate.paused,
        "command": gate.command,
        "live_policy_version": gate.policy_version,
        "in_flight": sum(r.in_flight for r in live),
        "waiting": sum(r.waiting for r in live),
        "gateways": [row_json(state.cluster, r, gate.command) for r in live],
    }


async def pause_gateways(state: GatewayState, timeout: float) -> dict[str, Any]:
    """Pause every gateway of this gateway's gate; answer once all drained or ``timeout`` passed.

    ``drained: false`` in the answer means some live gateway still had calls in flight or had not
    acked (``client.check_drained`` turns that into an error naming them). ``Conflict`` if a resume
    overtook the pause while it waited.
    """
    gate, _ = await state.cluster.command(paused=True)
    drained, gate, live = await state.cluster.wait_drained(gate.command, timeout)
    return {
        **gateway_state_json(state),
        "paused": True,
        "drained": drained,
        "command": gate.command,
        "live_policy_version": gate.policy_version,
        "in_flight": sum(r.in_flight for r in live),
        "waiting": sum(r.waiting for r in live),
        "gateways": [row_json(state.cluster, r, gate.command) for r in live],
    }


async def resume_gateways(
    state: GatewayState, *, policy_version: int | None = None, rewind: bool = False
) -> dict[str, Any]:
    """Open the gate of every gateway of this gateway's gate (the last committed command wins any race);
    answer once every live gateway applied it (``applied``; ``gateways`` lists them), a stalled one
    waited for until its lease ends or ``RESUME_APPLY_WAIT_S`` passed (then ``applied: false``; the
    resume is committed either way, and that gateway applies it as soon as it runs again).

    ``policy_version``: the version the trainer just loaded into a remote engine these gateways
    share (publishing it); each gateway records calls under it from now on. A gateway whose engine
    holds its own weights refuses it (``BadRequest``), as it does a version outside the store's
    range. Versions never go backwards: one below the live version (or this engine's) is refused
    (``Conflict``) and the gateways stay paused, because calls recorded under an older label would
    be trained on as if the older weights had sampled them; the current version again is accepted.
    ``rewind``: the trainer restored an older checkpoint into the servers (a ``--resume`` after a
    crash between an update and its checkpoint) and says so; then the older version is accepted.
    """
    engine = state.engine
    if policy_version is not None:
        if not engine.shares_weights:
            raise BadRequest(
                "policy_version on resume is for gateways in front of a shared remote engine; this "
                "gateway's engine holds its own weights (update them through the engine)",
                param="policy_version",
            )
        if not 0 <= policy_version <= INT64_MAX:
            raise BadRequest(f"policy_version must be in 0..{INT64_MAX}", param="policy_version")
        if not rewind and policy_version < engine.policy_version:
            raise Conflict(
                f"policy_version {policy_version} is older than the version this gateway serves "
                f"({engine.policy_version}); versions never go backwards (the gateway stays paused; a "
                "trainer restoring an older checkpoint passes rewind=true)"
            )
    gate, released = await state.cluster.command(paused=False, policy_version=policy_version, rewind=rewind)
    # Answered once every live gateway applied it (a stalled one only until its lease ends): the
    # trainer's next read of any of them (health, state, the version calls are labelled with) agrees.
    try:
        wait_s = min(RESUME_APPLY_WAIT_S, state.config.pause_timeout_s)
        applied, _, live = await state.cluster.wait_applied(gate.command, wait_s)
    except Exception:  # noqa: BLE001 - committed: the gateways apply it on their own; say so, not fail
        log.warning(
            "resume (command %d) committed; could not watch the gateways apply it",
            gate.command,
            exc_info=True,
        )
        applied, live = False, []
    return {
        **gateway_state_json(state),
        "released": released,
        "command": gate.command,
        "live_policy_version": gate.policy_version,
        "applied": applied,
        "gateways": [row_json(state.cluster, r, gate.command) for r in live],
    }


class GatewayHandle:
    """A gateway served in this process, driven from another event loop (the trainer's)."""

    def __init__(self, state: GatewayState, base_url: str) -> None:
        if state.loop is None:
            raise RuntimeError("the gateway has not started (its lifespan sets state.loop)")
        self.state = state
        self.base_url = base_url  # for messages (check_drained) and for harnesses

    async def _on_gateway_loop(self, make: Callable[[], Awaitable[T]]) -> T:
        loop = self.state.loop
        assert loop is not None
        if loop is asyncio.get_running_loop():
            return await make()

        async def run() -> T:
            return await make()

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), loop))

    @property
    def engine(self) -> Engine:
        return self.state.engine

    async def pause(self, timeout: float | None = None) -> dict[str, Any]:
        limit = self.state.config.pause_timeout_s if timeout is None else timeout
        return await self._on_gateway_loop(lambda: pause_gateways(self.state, limit))

    async def resume(self, policy_version: int | None = None, *, rewind: bool = False) -> dict[str, Any]:
        return await self._on_gateway_loop(
            lambda: resume_gateways(self.state, policy_version=policy_version, rewind=rewind)
        )

    async def update_weights(self, update: WeightUpdate) -> None:
        await self._on_gateway_loop(lambda: self.state.engine.update_weights(update))

    async def run(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run ``make()`` (a coroutine using the engine, say) on the gateway's loop."""
        return await self._on_gateway_loop(make)
