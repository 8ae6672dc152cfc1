"""Several engine replicas behind one Engine: affinity, health, retries, failover, draining.

Routing. A call with a ``rollout_id`` goes to the first *available* replica on a consistent-hash
ring (virtual nodes), so a rollout's calls land on the replica whose prefix cache holds its
conversation, and adding/removing a replica moves only ~1/N of the rollouts. A replica is available
when it is healthy and not draining; if none on the ring is, the call falls back to any non-draining
replica (a health check may simply be stale). Calls without a rollout go to the least-loaded one.

Failures before the first token (connection refused, timeout, 429, 5xx: ``RemoteEngineError`` with
``retryable``) are retried with exponential backoff, moving to the next replica on the ring; a
transport failure also marks the replica unhealthy until a health check passes again.

Failures after tokens were streamed (a replica dies mid-generation). Restarting from the prompt
would yield tokens the caller never sees alongside ones it already has, so it is never done once
something was yielded. Instead the pool *continues* the generation on another replica from
``prompt + tokens so far`` with the remaining budget. That is exact, not a heuristic: sampling is
autoregressive, so the distribution of the rest given the prefix is the same on any replica serving
the same weights, and the tokens already yielded keep their recorded logprobs. It is done only when
the new replica serves the same ``policy_version`` as the one that streamed the first tokens
(otherwise one answer would mix two policies); if not, or ``resume_mid_stream=False``, the error is
raised to the gateway. A replica that fails once the answer was whole (its stop token or its whole
budget of tokens or context yielded) ends the call there. An answer the
server itself cut short (:class:`~harnessrl.engines.remote.AbortedByEngine`: vLLM's ``abort``) is
retried from the prompt if nothing was yielded yet, and otherwise raised: it is never continued.

Weight updates. ``mode="all_at_once"`` (default; what the gateway's pause already implies): stop
routing, wait for every replica's in-flight calls, update all concurrently, re-admit; calls arriving
meanwhile wait rather than fail. ``mode="rolling"``: one replica at a time is drained, updated and
re-admitted while the others serve; ``policy_version`` reports the *oldest* version still serving,
so a call's recorded version is never newer than the weights that may have produced it.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from types import AsyncGeneratorType
from typing import Any, Literal

from harnessrl.engines.base import Engine, GenerationContext, Samples, SamplingParams, WeightUpdate
from harnessrl.engines.remote import RemoteEngineError, is_retryable
from harnessrl.errors import ConfigError, UpstreamError
from harnessrl.token_ids import TokenIds

log = logging.getLogger("harnessrl.engines.pool")


def _hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


@dataclass
class Replica:
    engine: Engine
    name: str
    healthy: bool = True
    draining: bool = False
    in_flight: int = 0
    served: int = 0  # generations started here (for tests and metrics)
    pending: WeightUpdate | None = None  # an update this replica missed (it was down); kept out until applied
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()

    @property
    def available(self) -> bool:
        return self.healthy and not self.draining


class EnginePool:
    """Implements :class:`harnessrl.engines.base.Engine` over ``replicas`` (started and closed with it).

    ``sleep`` is a seam for tests (backoff without waiting).
    """

    def __init__(
        self,
        replicas: Sequence[Engine],
        *,
        max_retries: int = 4,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        health_interval_s: float = 5.0,
        resume_mid_stream: bool = True,
        update_mode: Literal["all_at_once", "rolling"] = "all_at_once",
        virtual_nodes: int = 64,
        sleep: Any = asyncio.sleep,
    ):
        if not replicas:
            raise ConfigError("an engine pool needs at least one replica")
        self.replicas = [
            Replica(engine, getattr(engine, "base_url", None) or f"replica-{i}")
            for i, engine in enumerate(replicas)
        ]
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.health_interval_s = health_interval_s
        self.resume_mid_stream = resume_mid_stream
        self.update_mode = update_mode
        self._sleep = sleep
        self._ring = sorted(
            (_hash(f"{i}#{v}"), i) for i in range(len(self.replicas)) for v in range(virtual_nodes)
        )
        self._ring_keys = [h for h, _ in self._ring]
        self._admitting = asyncio.Event()
        self._admitting.set()
        self._health_task: asyncio.Task[None] | None = None
        self._update_lock = asyncio.Lock()

    # --- Engine properties (the first replica speaks for all: they serve the same model) ------------

    @property
    def model_name(self) -> str:
        return self.replicas[0].engine.model_name

    @property
    def tokenizer(self) -> Any:
        return self.replicas[0].engine.tokenizer

    @property
    def context_length(self) -> int:
        return min(r.engine.context_length for r in self.replicas)

    @property
    def policy_version(self) -> int:
        serving = [r for r in self.replicas if r.pending is None] or self.replicas
        return min(r.engine.policy_version for r in serving)

    @property
    def shares_weights(self) -> bool:
        return all(r.engine.shares_weights for r in self.replicas)

    async def release_weights(self) -> bool:
        return False  # the servers hold the weights, in their own processes

    def adopt_policy_version(self, version: int) -> None:
        """Every replica's weights were updated by someone else (the trainer): label them ``version``."""
        for replica in self.replicas:
            replica.engine.adopt_policy_version(version)  # raises ConfigError if it holds its own

    async def start(self) -> None:
        # A replica that is down at start is marked unhealthy rather than failing the pool: the
        # health loop re-admits it when it comes up. All down is a configuration problem.
        results = await asyncio.gather(*(r.engine.start() for r in self.replicas), return_exceptions=True)
        for replica, result in zip(self.replicas, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, UpstreamError):
                    raise result
                log.warning("replica %s did not start: %s", replica.name, result)
                replica.healthy = False
        if not any(r.healthy for r in self.replicas):
            raise UpstreamError("no replica of the engine pool could be reached")
        if self.health_interval_s > 0 and self._health_task is None:
            self._health_task = asyncio.create_task(self._health_loop(), name="engine-pool-health")

    async def aclose(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
            self._health_task = None
        await asyncio.gather(*(r.engine.aclose() for r in self.replicas), return_exceptions=True)

    # --- routing -----------------------------------------------------------------------------------

    def preference(self, rollout_id: str | None) -> list[int]:
        """Replica indices in the order a call of ``rollout_id`` tries them."""
        if len(self.replicas) == 1:
            return [0]
        if rollout_id is None:
            return sorted(range(len(self.replicas)), key=lambda i: self.replicas[i].in_flight)
        start = bisect.bisect(self._ring_keys, _hash(rollout_id)) % len(self._ring)
        order: list[int] = []
        for k in range(len(self._ring)):
            index = self._ring[(start + k) % len(self._ring)][1]
            if index not in order:
                order.append(index)
                if len(order) == len(self.replicas):
                    break
        return order

    def _pick(self, rollout_id: str | None, failed: dict[int, int]) -> int | None:
        """The replica for the next try of a call; ``failed`` counts this call's failures per replica.

        The first available one in preference order that this call has not failed on, else any
        non-draining one it has not failed on (its health check may be stale). Once every
        non-draining replica has failed this call, the one with the fewest failures, healthy first:
        a survivor's one transient failure must not send every remaining try to a dead replica.
        """
        order = self.preference(rollout_id)
        for pass_ in (lambda r: r.available, lambda r: not r.draining):
            for index in order:
                if index not in failed and pass_(self.replicas[index]):
                    return index
        candidates = [i for i in order if not self.replicas[i].draining]
        if not candidates:
            return None
        return min(candidates, key=lambda i: (failed.get(i, 0), not self.replicas[i].healthy))

    def _backoff(self, attempt: int) -> float:
        return min(self.max_backoff_s, self.backoff_s * 2**attempt)

    # --- generation --------------------------------------------------------------------------------

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, context: GenerationContext | None = None
    ) -> AsyncIterator[Samples]:
        rollout_id = context.rollout_id if context else None
        stops = frozenset(params.stop_token_ids)
        sampled: list[int] = []  # tokens already yielded to the caller
        ended = False  # a stop token was among them: the answer is whole
        version: int | None = None  # policy version of the replica that produced `sampled`
        attempt = 0
        failed: dict[int, int] = {}  # this call's failures per replica
        while True:
            await self._admitting.wait()  # an all-at-once weight update is in progress
            index = self._pick(rollout_id, failed)
            if index is None:
                await self._sleep(self._backoff(attempt))
                attempt += 1
                if attempt > self.max_retries:
                    raise UpstreamError("no engine replica is accepting calls")
                continue
            replica = self.replicas[index]
            if sampled and replica.engine.policy_version != version:
                raise UpstreamError(
                    f"replica died after {len(sampled)} tokens and no replica serving policy version "
                    f"{version} is left to continue the generation"
                )
            replica.in_flight += 1
            replica.served += 1
            replica.idle.clear()
            if sampled:  # continuing a generation a replica dropped: its tokens join the prompt
                stream = replica.engine.generate(
                    TokenIds.joined(prompt_ids, sampled),
                    replace(params, max_tokens=params.max_tokens - len(sampled)),
                    context,
                )
            else:
                # The prompt as given, not a copy: a gateway's ``TokenIds`` keeps its JSON encoding
                # (built from the previous call's), which a copy would make again from all its IDs.
                stream = replica.engine.generate(prompt_ids, params, context)
            try:
                if not sampled:
                    # The replica that produces the first tokens sets the version a continuation must
                    # match, not one that failed before any: replicas differ during a rolling update.
                    version = replica.engine.policy_version
                async for batch in stream:
                    sampled += batch.token_ids
                    if stops and not stops.isdisjoint(batch.token_ids):
                        ended = True
                    yield batch
                return
            except UpstreamError as exc:
                continuable = self.resume_mid_stream and not (
                    isinstance(exc, RemoteEngineError) and not exc.continuable
                )
                if sampled and (
                    ended
                    or len(sampled) >= params.max_tokens
                    or len(prompt_ids) + len(sampled) >= self.context_length
                ):
                    # The answer was whole (its stop token, or the whole budget of tokens or context,
                    # reached the caller) when the replica failed: nothing is left to continue, and
                    # nothing past it may be generated.
                    return
                if not is_retryable(exc) or (sampled and not continuable):
                    raise
                if isinstance(exc, RemoteEngineError) and not exc.is_overload:
                    replica.healthy = False  # the health loop re-admits it
                attempt += 1
                if attempt > self.max_retries:
                    raise
                failed[index] = failed.get(index, 0) + 1
                log.warning(
                    "replica %s failed (%s) after %d tokens; retry %d/%d",
                    replica.name,
                    exc,
                    len(sampled),
                    attempt,
                    self.max_retries,
                )
                if not sampled or isinstance(exc, RemoteEngineError) and exc.is_overload:
                    await self._sleep(self._backoff(attempt - 1))
            finally:
                # (An iterator that ran to its end has nothing left to close.)
                if not (isinstance(stream, AsyncGeneratorType) and stream.ag_frame is None):
                    with contextlib.suppress(Exception):
                        await stream.aclose()  # type: ignore[attr-defined]
                replica.in_flight -= 1
                if replica.in_flight == 0:
                    replica.idle.set()

    # --- health ------------------------------------------------------------------------------------

    async def check_health(self) -> None:
        """Probe every replica once; a replica is healthy iff its ``health()`` answers."""

        async def probe(replica: Replica) -> None:
            try:
                await replica.engine.health()
            except Exception as exc:  # any failure: route around it until it answers again
                if replica.healthy:
                    log.warning("replica %s unhealthy: %s", replica.name, exc)
                replica.healthy = False
            else:
                if not replica.healthy:
                    log.info("replica %s healthy again", replica.name)
                replica.healthy = True

        await asyncio.gather(*(probe(r) for r in self.replicas))

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self.check_health()
            for index, replica in enumerate(self.replicas):
                if replica.pending is not None and replica.healthy:
                    await self._apply_pending(index)

    async def _apply_pending(self, index: int) -> None:
        """Give a replica back the update it missed. Under the update lock: an update that comes
        meanwhile waits, rather than running beside this older one on the same server (whichever
        finished last would win, so the replica could go back into rotation with the older weights).
        A failure leaves it out (``pending``) and the loop going."""
        async with self._update_lock:
            update = self.replicas[index].pending
            if update is None or not self.replicas[index].healthy:
                return  # an update in between reached it, or it went down again
            try:
                await self._update_one(index, update)
            except Exception as exc:  # e.g. a ConfigError: the loop must go on checking the others
                log.warning(
                    "replica %s: applying missed update %d failed: %s",
                    self.replicas[index].name,
                    update.version,
                    exc,
                )

    async def health(self) -> dict[str, Any]:
        replicas = [
            {
                "name": r.name,
                "healthy": r.healthy,
                "draining": r.draining,
                "in_flight": r.in_flight,
                "policy_version": r.engine.policy_version,
            }
            for r in self.replicas
        ]
        if not any(r.healthy for r in self.replicas):
            raise UpstreamError("no engine replica is healthy")
        return {"engine": "pool", "policy_version": self.policy_version, "replicas": replicas}

    # --- weight updates ----------------------------------------------------------------------------

    async def drain(self, index: int) -> None:
        """Stop routing new calls to replica ``index`` and wait for its in-flight ones to finish."""
        replica = self.replicas[index]
        replica.draining = True
        await replica.idle.wait()

    def readmit(self, index: int) -> None:
        self.replicas[index].draining = False

    async def _update_one(self, index: int, update: WeightUpdate) -> bool:
        """Drain, update, re-admit. A replica that cannot take the update stays out of rotation
        (``pending``) until the health loop finds it up and applies it: serving old weights from
        one replica would silently make the pool's answers off-policy."""
        replica = self.replicas[index]
        await self.drain(index)
        try:
            await replica.engine.update_weights(update)
        except UpstreamError as exc:
            log.warning("replica %s missed weight update %d: %s", replica.name, update.version, exc)
            replica.pending, replica.healthy = update, False
            return False
        replica.pending = None
        self.readmit(index)
        return True

    async def update_weights(self, update: WeightUpdate) -> None:
        async with self._update_lock:
            if self.update_mode == "rolling":
                done = [await self._update_one(i, update) for i in range(len(self.replicas))]
            else:
                self._admitting.clear()
                try:
                    done = await asyncio.gather(
                        *(self._update_one(i, update) for i in range(len(self.replicas)))
                    )
                finally:
                    self._admitting.set()
            if not any(done):
                raise UpstreamError(f"no engine replica accepted weight update {update.version}")
