"""``RemoteGateway``: gateways started elsewhere (``harnessrl gateway``), as a fleet's gateways.

The trainer serves no gateway. It drives one (and, through the store they share, all of them)
over the control API, loads new weights into the remote engine servers with its own engine client,
and tells the gateways the version on resume; external ``harnessrl controller`` processes launch
the harnesses. The store is the one the gateways share (``[store] url``), so rollouts are created
and found complete exactly as with the local gateway. ``remote_fleet`` yields the run's
``GatewayFleet`` over them.
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
from harnessrl.errors import ConfigError, UpstreamError
from harnessrl.store.base import Store
from harnessrl.store.gate import DEFAULT_GATE
from harnessrl.trainer.fleet import RolloutBook, external_controllers_hint
from harnessrl.trainer.fleet_gateway import GatewayFleet, announce_start

T = TypeVar("T")


class RemoteGateway:
    """A ``GatewayControl`` over a gateway's control API and the trainer's own engine client."""

    def __init__(self, client: GatewayClient, engine: Engine, *, pause_timeout_s: float) -> None:
        self.client = client
        self._engine = engine  # the trainer's own client of the servers (started)
        self.base_url = client.base_url
        self.pause_timeout_s = pause_timeout_s

    @property
    def engine(self) -> Engine:
        return self._engine

    async def pause(self) -> dict[str, Any]:
        answer = await asyncio.to_thread(self.client.pause, self.pause_timeout_s)
        # Not a gateway's answer: nothing proves the calls drained ("false" as a string is truthy,
        # and the weights would change under calls still in flight).
        if not isinstance(answer, dict) or not isinstance(answer.get("drained", False), bool):
            raise UpstreamError(
                f"gateway at {self.base_url}: POST /api/pause answered {str(answer)[:200]!r}, "
                "not a harnessrl gateway's answer (is trainer.gateway_url a harnessrl gateway?)"
            )
        return answer

    async def resume(self, version: int | None, *, rewind: bool) -> None:
        await asyncio.to_thread(lambda: self.client.resume(policy_version=version, rewind=rewind))

    async def update_weights(self, update: WeightUpdate) -> None:
        await self._engine.update_weights(update)

    async def on_engine_loop(self, make: Callable[[], Awaitable[T]]) -> T:
        return await make()  # the trainer's own client lives on the trainer's loop


def check_same_store(state: dict[str, Any], store: Store, gateway_url: str, store_url: str) -> None:
    """``ConfigError`` unless the gateway that answered ``state`` (``GET /api/state``) is one of the
    gateways registered in ``store``: one started on another store pauses and versions another gate,
    and answers the run's rollouts' keys 401 (it does not know them), so the run could not train."""
    from harnessrl.store.postgres import redact

    if not isinstance(state, dict):  # another JSON API at that address
        raise ConfigError(
            f"trainer.gateway_url: the gateway at {gateway_url} does not answer GET /api/state as a "
            f"harnessrl gateway (got {type(state).__name__}): point it at a harnessrl gateway"
        )
    theirs = gateway_ids(state)
    # Among the rows of the gate that gateway serves (``gateway.gate``; a gateway of a harnessrl
    # before per-run gates names none: the default one).
    gate = state.get("gate")
    _, rows = store.read_gate_and_gateways(gate if isinstance(gate, str) else DEFAULT_GATE)
    if not theirs & {row.gateway_id for row in rows}:
        raise ConfigError(
            f"trainer.gateway_url: the gateway at {gateway_url} does not use the run's store "
            f"(store.url = {redact(store_url)}): start the gateways with --store set to the same "
            "store, or point trainer.gateway_url at gateways that use it"
        )


def gateway_ids(state: dict[str, Any]) -> set[str]:
    """The gateway ids a ``GET /api/state`` answer names (its own and its gate's live ones); what
    is not a string id (an answer that is not a gateway's) names none."""
    gateways = state.get("gateways")
    entries = [state, *(gateways if isinstance(gateways, list) else [])]
    ids = (entry.get("gateway_id") for entry in entries if isinstance(entry, dict))
    return {gateway_id for gateway_id in ids if isinstance(gateway_id, str)}


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
) -> AsyncIterator[tuple[GatewayFleet, Callable[[], None]]]:
    """Connect to the gateway at ``gateway_url`` and to the engine servers; yield the fleet and
    ``start_controllers`` (which only says how to start them: they are external)."""
    from harnessrl.engines.factory import create_engine

    engine = create_engine(engine_config)
    await engine.start()
    client: GatewayClient | None = None
    try:
        client = GatewayClient(gateway_url, admin_key, timeout=60.0)
        state = await asyncio.to_thread(client.state)  # reachable, and the admin key is right
        await asyncio.to_thread(check_same_store, state, book.store, gateway_url, store_url)

        def start_controllers() -> None:
            message(external_controllers_hint(store_url, gateway_url))

        gateway = RemoteGateway(client, engine, pause_timeout_s=pause_timeout_s)
        await announce_start(gateway)
        yield GatewayFleet(book, gateway, weights_root=run_dir / "engine-weights"), start_controllers
    finally:
        if client is not None:
            client.close()
        await engine.aclose()
