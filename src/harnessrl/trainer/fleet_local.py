"""``LocalFleet``: rollouts produced by the gateway this process serves (``local_stack``).

The gate and the engine are the gateway's own objects, reached in-process on the gateway's event
loop (``gateway.gating.GatewayHandle``): the trainer pauses the very gate its weight update needs
quiet, and installs weights into the very engine object that serves, with no second client. Peer
gateways (``[gateway] peers``) are paused and resumed through the same fan-out the control API
uses. Which weights an engine takes is its own capability, not a guess from its name: an engine
that ``shares_weights`` (remote servers) loads a Hugging Face folder and every gateway adopts the
version on resume; an embedded one takes the state dict in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import statistics
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from harnessrl.client import check_drained
from harnessrl.controller.stack import RolloutConfig, local_stack
from harnessrl.engines.base import Engine, GenerationContext, SamplingParams, WeightUpdate
from harnessrl.engines.pool import EnginePool
from harnessrl.errors import ConfigError
from harnessrl.gateway.gating import GatewayHandle
from harnessrl.trainer.config import TrainerSection
from harnessrl.trainer.fleet import Group, RolloutBook, Weights, external_controllers_hint
from harnessrl.trainer.schedule import GroupPlan

# The served-weights check's prompt: any fixed text the tokenizer can encode.
T = TypeVar("T")
SERVED_WEIGHTS_PROBE = "The trainer and the engine must agree on every logprob of this sentence."


async def load_weights(
    engine_update: Callable[[WeightUpdate], Any],
    shares_weights: bool,
    version: int,
    weights: Weights,
    weights_root: Path,
) -> None:
    """Give an engine ``weights`` as ``version``: in place, or as a folder its servers load
    (``<weights_root>/v<N>``; older versions are removed once the new one is loaded)."""
    if not shares_weights:
        await engine_update(WeightUpdate(version=version, state_dict=weights.engine_state_dict()))
        return
    folder = weights_root / f"v{version}"
    await asyncio.to_thread(weights.save_checkpoint, folder, with_optimizer=False)
    await engine_update(WeightUpdate(version=version, checkpoint_dir=str(folder)))
    for old in weights_root.glob("v*"):
        if old != folder:
            shutil.rmtree(old, ignore_errors=True)


async def probe_replicas(pool: EnginePool, prompt: list[int]) -> list[tuple[str, list[int], list[float]]]:
    """A short sampled generation of ``prompt`` on every server of ``pool``: (name, ids, logprobs)."""
    params = SamplingParams(max_tokens=16, temperature=1.0)
    context = GenerationContext(stream=False)
    out = []
    for replica in pool.replicas:
        samples = [s async for s in replica.engine.generate(prompt, params, context)]
        out.append((replica.name, [s.token_id for s in samples], [s.logprob for s in samples]))
    return out


def served_weights_check(
    policy: Any, trainer: TrainerSection, message: Callable[[str], None]
) -> Callable[[str, list[int], list[int], list[float]], Awaitable[None]]:
    """The check ``check_served_weights`` runs per server: a remote server must serve the weights
    the trainer holds (``trainer.model``, or the checkpoint a ``--resume`` reloaded), or every
    sample is silently off-policy. ``ConfigError`` naming the server when they differ."""
    tolerance = trainer.served_weights_tolerance

    async def check(name: str, prompt: list[int], ids: list[int], served: list[float]) -> None:
        ours = await asyncio.to_thread(policy.response_logprobs, prompt, ids)
        gap = statistics.fmean(abs(a - b) for a, b in zip(served, ours, strict=True)) if served else 0.0
        if gap > tolerance:
            raise ConfigError(
                f"the engine at {name} does not serve the trainer's weights "
                f"({trainer.model or 'trainer.model'}): on a probe its logprobs differ from "
                f"the trainer's by {gap:.3f} nats per token on average (tolerance "
                f"trainer.served_weights_tolerance = {tolerance}); start the server on the same weights"
            )
        message(f"engine at {name} serves the trainer's weights (gap {gap:.4f} nats)")

    return check


class LocalFleet:
    """The fleet of the gateway this process serves; ``RemoteFleet`` swaps in HTTP gateways and
    the trainer's own engine client for the four primitives at the end."""

    def __init__(self, gateway: GatewayHandle, book: RolloutBook, *, weights_root: Path) -> None:
        self.gateway = gateway
        self.book = book
        self.weights_root = weights_root  # engine-weights/ of the run folder (servers load from it)
        self.base_url = gateway.base_url
        self._pause_depth = 0
        self._announce: int | None = None  # a version published while paused, for the resume
        self._rewind = False  # that version restores an older checkpoint

    async def submit(self, plans: Sequence[GroupPlan]) -> None:
        await self.book.submit(plans)

    async def completed(
        self, n: int, *, top_up: Callable[[], Sequence[GroupPlan]] | None = None
    ) -> list[Group]:
        return await self.book.completed(n, top_up=top_up)

    async def finished(self, plan: GroupPlan) -> Group:
        return await self.book.finished(plan)

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        if self._pause_depth == 0:
            answer = await self._pause()
            try:
                check_drained(answer, self.base_url)
            except Exception:
                await self._resume(None, rewind=False)
                raise
        self._pause_depth += 1
        try:
            yield
        finally:
            self._pause_depth -= 1
            if self._pause_depth == 0:
                version, self._announce = self._announce, None
                rewind, self._rewind = self._rewind, False
                await self._resume(version, rewind=rewind)

    async def publish(self, version: int, weights: Weights, *, restore: bool = False) -> None:
        async with self.paused():
            shared = self._engine().shares_weights
            await load_weights(self._update, shared, version, weights, self.weights_root)
            if shared:  # every gateway in front of the same servers labels calls with it
                self._announce, self._rewind = version, restore

    async def check_served_weights(
        self, check: Callable[[str, list[int], list[int], list[float]], Awaitable[None]]
    ) -> None:
        engine = self._engine()
        if not isinstance(engine, EnginePool):
            return  # an embedded engine serves the trainer's own starting weights by construction
        prompt = engine.tokenizer.encode(SERVED_WEIGHTS_PROBE)
        for name, ids, logprobs in await self._on_engine_loop(lambda: probe_replicas(engine, prompt)):
            await check(name, prompt, ids, logprobs)

    # -- primitives: the gateway's gate and engine, in this process ---------------------------------------
    async def _pause(self) -> dict[str, Any]:
        return await self.gateway.pause()

    async def _resume(self, version: int | None, *, rewind: bool) -> None:
        await self.gateway.resume(policy_version=version, rewind=rewind)

    async def _update(self, update: WeightUpdate) -> None:
        await self.gateway.update_weights(update)

    def _engine(self) -> Engine:
        return self.gateway.engine

    async def _on_engine_loop(self, make: Callable[[], Awaitable[T]]) -> T:
        return await self.gateway.run(make)


@contextlib.asynccontextmanager
async def local_fleet(
    config: RolloutConfig,
    run_dir: Path,
    book: RolloutBook,
    *,
    external_controllers: bool,
    message: Callable[[str], None],
    store_url: str,
) -> AsyncIterator[tuple[LocalFleet, Callable[[], None]]]:
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
            yield LocalFleet(stack.gateway, book, weights_root=run_dir / "engine-weights"), start_controllers
        finally:
            stop.set()
            await asyncio.gather(*running)
