"""``RemoteFleet``: rollouts produced by gateways started elsewhere (``harnessrl gateway``).

The trainer serves no gateway. It drives one (and, through its ``[gateway] peers``, all of them)
over the control API, loads new weights into the remote engine servers with its own engine client,
and tells the gateways the version on resume; external ``harnessrl controller`` processes launch
the harnesses. The store is the one the gateways share (``[store] url``), so rollouts are created
and found complete exactly as with a ``LocalFleet``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from harnessrl.client import GatewayClient
from harnessrl.config import EngineConfig
from harnessrl.engines.base import Engine, WeightUpdate
from harnessrl.trainer.fleet import RolloutBook, external_controllers_hint
from harnessrl.trainer.fleet_local import LocalFleet

T = TypeVar("T")


class RemoteFleet(LocalFleet):
    def __init__(
        self,
        client: GatewayClient,
        engine: Engine,
        book: RolloutBook,
        *,
        weights_root: Path,
        pause_timeout_s: float,
    ) -> None:
        self.client = client
        self.engine = engine  # the trainer's own client of the servers (started)
        self.book = book
        self.weights_root = weights_root
        self.base_url = client.base_url
        self.pause_timeout_s = pause_timeout_s
        self._pause_depth = 0
        self._announce: int | None = None
        self._rewind = False

    async def _pause(self) -> dict[str, Any]:
        return await asyncio.to_thread(self.client.pause, self.pause_timeout_s)

    async def _resume(self, version: int | None, *, rewind: bool) -> None:
        await asyncio.to_thread(lambda: self.client.resume(policy_version=version, rewind=rewind))

    async def _update(self, update: WeightUpdate) -> None:
        await self.engine.update_weights(update)

    def _engine(self) -> Engine:
        return self.engine

    async def _on_engine_loop(self, make: Callable[[], Awaitable[T]]) -> T:
        return await make()


@contextlib.asynccontextmanager
async def remote_fleet(
    gateway_url: str,
    admin_key: str,
    engine_config: EngineConfig,
    run_dir: Path,
    book: RolloutBook,
    *,
    pause_timeout_s: float,
    message: Callable[[str], None],
    store_url: str,
) -> AsyncIterator[tuple[RemoteFleet, Callable[[], None]]]:
    """Connect to the gateway at ``gateway_url`` and to the engine servers; yield the fleet and
    ``start_controllers`` (which only says how to start them: they are external)."""
    from harnessrl.engines.factory import create_engine

    engine = create_engine(engine_config)
    await engine.start()
    client = GatewayClient(gateway_url, admin_key, timeout=60.0)
    try:
        await asyncio.to_thread(client.state)  # reachable, and the admin key is right

        def start_controllers() -> None:
            message(external_controllers_hint(store_url, gateway_url))

        fleet = RemoteFleet(
            client, engine, book, weights_root=run_dir / "engine-weights", pause_timeout_s=pause_timeout_s
        )
        yield fleet, start_controllers
    finally:
        client.close()
        await engine.aclose()
