"""Pausing and resuming a gateway and its peers: one implementation, two doors.

The control API (``POST /api/pause``, ``/api/resume``) and a trainer in the same process
(``GatewayHandle``) run the same two functions, so a trainer that hosts its gateway and one that
drives gateways over HTTP pause, drain, order and version them identically (``gateway.cluster``
explains the ordering and the fan-out to peers).

``GatewayHandle`` is how code on another event loop (the trainer's) reaches a gateway served in a
background thread (``serve_in_thread``): the gate's futures and the engine's HTTP clients belong to
the gateway's loop, so everything the handle does is scheduled there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from harnessrl.engines.base import Engine, WeightUpdate
from harnessrl.errors import BadRequest, Conflict
from harnessrl.gateway.cluster import Order, Scope, aggregate, format_order
from harnessrl.gateway.json_input import INT64_MAX
from harnessrl.gateway.state import GatewayState

T = TypeVar("T")


def gateway_state_json(state: GatewayState) -> dict[str, Any]:
    """What ``/api/state`` reports for this gateway process."""
    state.refresh_gauges()
    return {
        "paused": state.gate.paused,
        "in_flight": state.gate.in_flight,
        "waiting": state.gate.waiting,
        "model": state.engine.model_name,
        "policy_version": state.engine.policy_version,
        "context_length": state.engine.context_length,
        "uptime_s": round(state.uptime(), 3),
        "order": format_order(state.cluster.last),  # stamp of the last pause/resume applied
    }


async def pause_gateways(
    state: GatewayState, timeout: float, *, scope: Scope = "cluster", order: Order | None = None
) -> dict[str, Any]:
    """Close this gateway's gate and its peers'; answer once all drained or ``timeout`` passed.

    ``drained: false`` in the answer means some gateway still had calls in flight
    (``client.check_drained`` turns that into an error). ``Conflict`` if a newer resume overtook it.
    """
    cluster = state.cluster
    stamp = cluster.stamp(order)
    if not cluster.apply(stamp, "pause") and cluster.last_kind == "resume":
        raise Conflict(
            f"pause {format_order(stamp)} was overtaken by a newer resume ({format_order(cluster.last)}); "
            "the gateways are serving: pause again before updating weights"
        )
    # Applied, or older than a pause already in force: either way the gate is (kept) closed and
    # this request waits for the drain like the newer one does.
    state.gate.close()
    state.refresh_gauges()  # paused: 1
    drained, peers = await asyncio.gather(
        state.gate.drain(timeout), cluster.forward("POST", "/api/pause", scope, stamp, timeout)
    )
    if cluster.last_kind == "resume" and cluster.last > stamp:
        raise Conflict(
            f"pause {format_order(stamp)} was overtaken by a newer resume ({format_order(cluster.last)}) "
            "while draining; pause again before updating weights"
        )
    local = {**gateway_state_json(state), "paused": True, "drained": drained}
    return aggregate(local, peers)


async def resume_gateways(
    state: GatewayState,
    *,
    scope: Scope = "cluster",
    order: Order | None = None,
    policy_version: int | None = None,
    rewind: bool = False,
) -> dict[str, Any]:
    """Open this gateway's gate and its peers', unless a newer pause is in force (``superseded``).

    ``policy_version``: the version the trainer just loaded into a remote engine these gateways
    share; each gateway records calls under it from now on. A gateway whose engine holds its own
    weights refuses it (``BadRequest``), as it does a version outside the store's range. Versions
    never go backwards: one below the engine's current version is refused (``Conflict``) and the
    gateway stays paused, because calls recorded under an older label would be trained on as if
    the older weights had sampled them; the current version again is accepted (a repeated resume).
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
    cluster = state.cluster
    stamp = cluster.stamp(order)
    # Only a resume that will apply can go backwards; a stale one answers ``superseded`` as before.
    if (
        policy_version is not None
        and not rewind
        and stamp > cluster.last
        and policy_version < engine.policy_version
    ):
        raise Conflict(
            f"policy_version {policy_version} is older than the version this gateway serves "
            f"({engine.policy_version}); versions never go backwards (the gateway stays paused; a "
            "trainer restoring an older checkpoint passes rewind=true)"
        )
    applied = cluster.apply(stamp, "resume")
    if applied and policy_version is not None and engine.shares_weights:
        # The trainer installed new weights in a shared remote engine itself (docs/gateway.md,
        # "Several gateways"); every gateway records calls from now on under this version.
        engine.adopt_policy_version(policy_version)
    released = state.gate.resume() if applied else 0
    extra = {"policy_version": str(policy_version)} if policy_version is not None else None
    if extra is not None and rewind:
        extra["rewind"] = "true"
    peers = await cluster.forward("POST", "/api/resume", scope, stamp, None, extra)
    local = {**gateway_state_json(state), "released": released, "superseded": not applied}
    return aggregate(local, peers)


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
