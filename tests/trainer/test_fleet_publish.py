"""``GatewayFleet.publish`` to an engine that takes the state dict in place: the weights are gathered
off the run's event loop. Under torchrun ``engine_state_dict`` is a full gather of the sharded
weights (seconds); on the loop it stalled everything else there (the run's controllers, its
rollout book) until it returned."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from harnessrl.engines.base import WeightUpdate
from harnessrl.trainer.fleet_gateway import GatewayFleet


class InPlaceEngine:
    """An engine holding its own weights (``shares_weights`` False): it takes the state dict."""

    shares_weights = False


class Gateway:
    """A ``GatewayControl`` that drains at once and records the weight updates it is given."""

    base_url = "http://gateway.test"

    def __init__(self) -> None:
        self.engine = InPlaceEngine()
        self.updates: list[WeightUpdate] = []
        self.paused = False

    async def pause(self) -> dict[str, Any]:
        self.paused = True
        return {"drained": True}

    async def resume(self, version: int | None, *, rewind: bool) -> None:
        self.paused = False

    async def update_weights(self, update: WeightUpdate) -> None:
        assert self.paused
        self.updates.append(update)

    async def on_engine_loop(self, make: Callable[[], Awaitable[Any]]) -> Any:
        return await make()


class GatheredWeights:
    """Weights whose ``engine_state_dict`` stands for torchrun's gather: it returns once the run's
    event loop ran a callback meanwhile, as the loop's other work must be able to. Bounded: on a
    blocked loop it gives up and says so instead of hanging the test."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.loop_ran = threading.Event()

    def engine_state_dict(self) -> dict[str, Any]:
        self.loop.call_soon_threadsafe(self.loop_ran.set)
        if not self.loop_ran.wait(timeout=10):
            raise AssertionError("the run's event loop was blocked while the weights were gathered")
        return {"lm_head.weight": [1.0]}

    def save_checkpoint(self, folder: Path, *, with_optimizer: bool = True) -> Path:
        raise AssertionError("an in-place engine takes the state dict")

    def save_adapter(self, folder: Path) -> bool:
        raise AssertionError("an in-place engine takes the state dict")


def test_publish_gathers_the_weights_while_the_event_loop_keeps_serving(tmp_path):
    gateway = Gateway()

    async def main() -> None:
        weights = GatheredWeights(asyncio.get_running_loop())
        fleet = GatewayFleet(None, gateway, weights_root=tmp_path)  # type: ignore[arg-type]
        await fleet.publish(3, weights)

    asyncio.run(main())
    [update] = gateway.updates
    assert (update.version, update.state_dict) == (3, {"lm_head.weight": [1.0]})
    assert not gateway.paused
