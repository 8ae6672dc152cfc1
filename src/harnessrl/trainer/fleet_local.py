"""``LocalGateway``: the gateway this process serves (``local_stack``), as a fleet's gateways.

The gate and the engine are the gateway's own objects, reached in-process on the gateway's event
loop (``gateway.control.gating.GatewayHandle``): the trainer pauses the very gate its weight update needs
quiet, and installs weights into the very engine object that serves, with no second client. Other
gateways on the same store are paused and resumed through its gate, as the control API does
(``gateway.control.cluster``). ``local_fleet`` serves the gateway and yields the run's ``GatewayFleet`` over it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from harnessrl.controller.stack import RolloutConfig, local_stack
from harnessrl.engines.base import Engine, WeightUpdate
from harnessrl.gateway.control.gating import GatewayHandle
from harnessrl.trainer.fleet import RolloutBook, external_controllers_hint
from harnessrl.trainer.fleet_gateway import GatewayFleet, announce_start

T = TypeVar("T")


class LocalGateway:
    """A ``GatewayControl`` over the gateway this process serves."""

    def __init__(self, handle: GatewayHandle) -> None:
        self.handle = handle
        self.base_url = handle.base_url

    @property
    def engine(self) -> Engine:
        return self.handle.engine

    async def pause(self) -> dict[str, Any]:
        return await self.handle.pause()

    async def resume(self, version: int | None, *, rewind: bool) -> None:
        await self.handle.resume(policy_version=version, rewind=rewind)

    async def update_weights(self, update: WeightUpdate) -> None:
        await self.handle.update_weights(update)

    async def on_engine_loop(self, make: Callable[[], Awaitable[T]]) -> T:
        return await self.handle.run(make)


@contextlib.asynccontextmanager
async def local_fleet(
    config: RolloutConfig,
    run_dir: Path,
    book: RolloutBook,
    *,
    external_controllers: bool,
    message: Callable[[str], None],
    store_url: str,
) -> AsyncIterator[tuple[GatewayFleet, Callable[[], None]]]:
    """Serve a gateway (``local_stack``) and yield its fleet and ``start_controllers``.

    Controllers start only when the trainer says so: a resumed run first publishes its checkpoint,
    and no rollout may sample from the starting weights before that. Leaving the block stops them,
    then the gateway."""
    async with local_stack(config, run_dir, store=book.store, run_id=book.run_id) as stack:
        stop = asyncio.Event()
        running: list[asyncio.Task[None]] = []

        def start_controllers() -> None:
            if external_controllers:
                message(external_controllers_hint(store_url, stack.gateway_url))
                return
            stack.controller.on_attempt_done = book.notify
            running.append(asyncio.create_task(stack.controller.run_forever(stop)))

        try:
            gateway = LocalGateway(stack.gateway)
            await announce_start(gateway)
            fleet = GatewayFleet(book, gateway, weights_root=run_dir / "engine-weights")
            yield fleet, start_controllers
        finally:
            stop.set()
            await asyncio.gather(*running)
