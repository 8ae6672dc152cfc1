"""``GatewayFleet``: the ``Fleet`` of a run, composed of its ``RolloutBook`` and the gateways it drives.

Rollouts go through the book (store rows, open groups, completion, the per-rollout deadline);
generation is held and weights are installed through a ``GatewayControl``: the gateway this process
serves, reached in-process (``fleet_local.LocalGateway``), or gateways started elsewhere and the
trainer's own client of the remote servers (``fleet_remote.RemoteGateway``). Which weights an
engine takes is its own capability, not a guess from its name: an engine that ``shares_weights``
(remote servers) loads a Hugging Face folder and every gateway adopts the version on resume; an
embedded one takes the state dict in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import statistics
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from harnessrl.client import check_drained
from harnessrl.engines.base import Engine, GenerationContext, SamplingParams, WeightUpdate, collect_samples
from harnessrl.engines.pool import EnginePool
from harnessrl.errors import ConfigError
from harnessrl.trainer.base import Policy, Weights
from harnessrl.trainer.config import TrainerSection
from harnessrl.trainer.fleet import Group, RolloutBook
from harnessrl.trainer.schedule import GroupPlan

T = TypeVar("T")
# The served-weights check's prompt: any fixed text the tokenizer can encode.
SERVED_WEIGHTS_PROBE = "The trainer and the engine must agree on every logprob of this sentence."


class GatewayControl(Protocol):
    """The gateways a fleet pauses and resumes, and the engine its weights go to."""

    base_url: str

    @property
    def engine(self) -> Engine:
        """The engine new weights are loaded into (the gateway's own, or the trainer's client)."""
        ...

    async def pause(self) -> dict[str, Any]:
        """Pause every gateway; the answer says whether in-flight calls drained (``check_drained``)."""
        ...

    async def resume(self, version: int | None, *, rewind: bool) -> None:
        """Resume every gateway, announcing ``version`` (None: unchanged)."""
        ...

    async def update_weights(self, update: WeightUpdate) -> None:
        """Load ``update`` into ``engine``."""
        ...

    async def on_engine_loop(self, make: Callable[[], Awaitable[T]]) -> T:
        """Await ``make()`` on the event loop ``engine`` lives on."""
        ...


async def load_weights(
    engine_update: Callable[[WeightUpdate], Any],
    shares_weights: bool,
    version: int,
    weights: Weights,
    weights_root: Path,
) -> None:
    """Give an engine ``weights`` as ``version``: in place, or as a folder its servers load
    (``<weights_root>/v<N>``; older versions are removed once the new one is loaded). With LoRA
    that folder holds the adapter alone (PEFT format), which the servers load as a new adapter."""
    if not shares_weights:
        # In a thread: under torchrun this is a full gather of the sharded weights (seconds), which
        # on the event loop would stall the run's controllers and rollout book meanwhile. Safe off
        # the loop: the policy is called from one thread at a time (its step and checkpoint writes
        # go through threads too, each awaited), so every rank still enters the same collectives in
        # the same order (``torchrun.LeaderPolicy``).
        state_dict = await asyncio.to_thread(weights.engine_state_dict)
        await engine_update(WeightUpdate(version=version, state_dict=state_dict))
        return
    folder = weights_root / f"v{version}"
    if folder.exists():  # a version published again (a resumed run's restore)
        await asyncio.to_thread(shutil.rmtree, folder)
    if not await asyncio.to_thread(weights.save_adapter, folder):
        await asyncio.to_thread(weights.save_checkpoint, folder, with_optimizer=False)
    await engine_update(WeightUpdate(version=version, checkpoint_dir=str(folder)))
    for old in weights_root.glob("v*"):
        if old != folder:
            shutil.rmtree(old, ignore_errors=True)


async def announce_start(gateway: GatewayControl) -> None:
    """Open the gate of the run's gateways (``gateway.gate``) in the store, telling those in front
    of shared servers that the run starts at version 0. Gateways of other gates on the store (other
    runs') are untouched.

    The gate outlives runs. It may be closed: a run killed inside a pause (SIGKILL, the kernel's OOM
    killer during a step) never resumed it, and every gateway of that gate, this run's included,
    comes up paused; no publish of a run resumed before its first checkpoint would open
    it, so its calls would wait until their rollouts' deadline. A gateway in front of shared
    servers adopts the gate's live version on start, which on a store reused from an earlier run is
    that run's last one. A run starts from its own weights (a resumed run publishes its
    checkpoint's version right after), so it announces 0 first, as a rewind. Engines holding their
    own weights label their own calls: for them the resume announces no version."""
    shared = gateway.engine.shares_weights
    await gateway.resume(0 if shared else None, rewind=shared)


async def probe_replicas(pool: EnginePool, prompt: list[int]) -> list[tuple[str, list[int], list[float]]]:
    """A short sampled generation of ``prompt`` on every server of ``pool``: (name, ids, logprobs)."""
    params = SamplingParams(max_tokens=16, temperature=1.0)
    context = GenerationContext(stream=False)
    out = []
    for replica in pool.replicas:
        ids, logprobs = await collect_samples(replica.engine.generate(prompt, params, context))
        out.append((replica.name, ids, logprobs))
    return out


def served_weights_check(
    policy: Policy, trainer: TrainerSection, message: Callable[[str], None]
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


class GatewayFleet:
    """A ``Fleet``: rollouts through ``book``, generation and weights through ``gateway``."""

    def __init__(self, book: RolloutBook, gateway: GatewayControl, *, weights_root: Path) -> None:
        self.book = book
        self.gateway = gateway
        self.weights_root = weights_root  # engine-weights/ of the run folder (servers load from it)
        self._pause_depth = 0
        self._announce: int | None = None  # a version published while paused, for the resume
        self._rewind = False  # that version restores an older checkpoint

    # -- rollouts: the book -----------------------------------------------------------------------------
    @property
    def open_groups(self) -> int:
        return self.book.open_groups

    @property
    def in_flight(self) -> int:
        return self.book.in_flight

    async def submit(self, plans: Sequence[GroupPlan]) -> None:
        await self.book.submit(plans)

    async def completed(
        self, n: int, *, top_up: Callable[[], Sequence[GroupPlan]] | None = None
    ) -> list[Group]:
        return await self.book.completed(n, top_up=top_up)

    async def finished(
        self, plan: GroupPlan, *, top_up: Callable[[], Sequence[GroupPlan]] | None = None
    ) -> Group:
        return await self.book.finished(plan, top_up=top_up)

    async def record_trained(
        self, version: int, groups: Sequence[Group], advantages: Mapping[str, float]
    ) -> None:
        await self.book.record_trained(version, groups, advantages)

    async def mark_failed_step(self, groups: Sequence[Group], reason: str) -> None:
        await self.book.mark_failed_step(groups, reason)

    async def recover(self, plans: Callable[[int], Sequence[GroupPlan]], *, policy_version: int) -> int:
        return await self.book.recover(plans, policy_version=policy_version)

    async def retire_evaluations(self, after_step: int) -> dict[int, int]:
        return await asyncio.to_thread(self.book.retire_evaluations, after_step)

    # -- generation and weights: the gateways -----------------------------------------------------------
    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        if self._pause_depth == 0:
            try:
                check_drained(await self.gateway.pause(), self.gateway.base_url)
            except BaseException:
                # The pause closes the gate before it waits for the drain, so it may be closed though
                # the pause failed (no drain, an HTTP error, the run cancelled meanwhile). The gate
                # is in the store and outlives the run: left closed, it holds every gateway there.
                with contextlib.suppress(Exception):
                    await self.gateway.resume(None, rewind=False)
                raise
        self._pause_depth += 1
        try:
            yield
        finally:
            self._pause_depth -= 1
            if self._pause_depth == 0:
                version, self._announce = self._announce, None
                rewind, self._rewind = self._rewind, False
                await self.gateway.resume(version, rewind=rewind)

    async def release_engine_weights(self) -> bool:
        return await self.gateway.on_engine_loop(self.gateway.engine.release_weights)

    async def publish(self, version: int, weights: Weights, *, restore: bool = False) -> None:
        async with self.paused():
            shared = self.gateway.engine.shares_weights
            await load_weights(self.gateway.update_weights, shared, version, weights, self.weights_root)
            if shared:  # every gateway in front of the same servers labels calls with it
                self._announce, self._rewind = version, restore

    async def check_served_weights(
        self, check: Callable[[str, list[int], list[int], list[float]], Awaitable[None]]
    ) -> None:
        engine = self.gateway.engine
        if not isinstance(engine, EnginePool):
            return  # an embedded engine serves the trainer's own starting weights by construction
        prompt = engine.tokenizer.encode(SERVED_WEIGHTS_PROBE)
        for name, ids, logprobs in await self.gateway.on_engine_loop(lambda: probe_replicas(engine, prompt)):
            await check(name, prompt, ids, logprobs)
