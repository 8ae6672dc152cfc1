"""``GatewayFleet.paused``: the gateways' gate is open again on every way out of a pause, also when
the pause itself failed or was cancelled after it had closed the gate (the gate lives in the store
and outlives the run: a gate left closed holds every gateway on that store)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from harnessrl.errors import UpstreamError
from harnessrl.trainer.fleet_gateway import GatewayFleet


class Gate:
    """A ``GatewayControl`` whose pause closes the gate first, then waits for the drain (as
    ``pause_gateways`` does): ``drain`` says how that wait ends."""

    base_url = "http://gateway.test"

    def __init__(self, drain: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        self.drain = drain
        self.closed = False
        self.draining = asyncio.Event()

    @property
    def engine(self) -> Any:
        raise AssertionError("not used by a pause")

    async def pause(self) -> dict[str, Any]:
        self.closed = True
        self.draining.set()
        return await self.drain()

    async def resume(self, version: int | None, *, rewind: bool) -> None:
        self.closed = False

    async def update_weights(self, update: Any) -> None:
        raise AssertionError("not used by a pause")

    async def on_engine_loop(self, make: Callable[[], Awaitable[Any]]) -> Any:
        return await make()


def fleet(gate: Gate) -> GatewayFleet:
    return GatewayFleet(None, gate, weights_root=Path("unused"))  # type: ignore[arg-type]


async def pause_once(f: GatewayFleet) -> None:
    async with f.paused():
        pass


def test_a_pause_that_failed_after_closing_the_gate_opens_it_again():
    async def http_error() -> dict[str, Any]:  # e.g. the control API's answer lost to a timeout
        raise UpstreamError("POST /api/pause: read timed out")

    gate = Gate(http_error)
    with pytest.raises(UpstreamError, match="read timed out"):
        asyncio.run(pause_once(fleet(gate)))
    assert not gate.closed


def test_a_pause_cancelled_during_the_drain_opens_the_gate_again():
    never = asyncio.Event()

    async def forever() -> dict[str, Any]:
        await never.wait()
        return {"drained": True}

    gate = Gate(forever)

    async def main() -> None:
        pausing = asyncio.create_task(pause_once(fleet(gate)))  # the run is stopped (Ctrl-C) meanwhile
        await gate.draining.wait()
        pausing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pausing

    asyncio.run(main())
    assert not gate.closed


def test_a_pause_that_did_not_drain_opens_the_gate_again_and_a_good_one_keeps_it_closed_inside():
    async def stuck() -> dict[str, Any]:
        return {
            "drained": False,
            "gateways": [{"url": "http://gateway.test", "drained": False, "in_flight": 2}],
        }

    gate = Gate(stuck)
    with pytest.raises(UpstreamError, match="did not drain"):
        asyncio.run(pause_once(fleet(gate)))
    assert not gate.closed

    async def drained() -> dict[str, Any]:
        return {"drained": True}

    good = Gate(drained)
    seen: list[bool] = []

    async def inside() -> None:
        async with fleet(good).paused():
            seen.append(good.closed)

    asyncio.run(inside())
    assert seen == [True] and not good.closed
