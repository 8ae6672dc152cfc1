"""What every route of one gateway app shares: config, store, engine, gate, metrics, reuse memory,
the calls in flight."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import anyio.to_thread

from harnessrl.config import GatewayConfig
from harnessrl.engines.base import Engine
from harnessrl.gateway.control.cluster import Cluster
from harnessrl.gateway.control.pause import PauseGate
from harnessrl.gateway.metrics import GatewayMetrics
from harnessrl.gateway.parsers.formats import ModelFormats, resolve_formats
from harnessrl.gateway.parsers.reasoning import ReasoningParser, ReasoningParserFactory, get_reasoning_parser
from harnessrl.gateway.parsers.tools import (
    CountingParser,
    ToolParser,
    ToolParserFactory,
    Tools,
    get_tool_parser,
)
from harnessrl.gateway.pipeline.delivery import CallsInFlight, DropReason
from harnessrl.gateway.prompt.history import CallHistory
from harnessrl.gateway.writer import CallWriter
from harnessrl.schemas import now
from harnessrl.store.base import Store

if TYPE_CHECKING:
    from harnessrl.gateway.teacher import Teacher

T = TypeVar("T")

log = logging.getLogger("harnessrl.gateway")

#: Prompt tokens decoded to see whether the generation prompt opened the reasoning block
#: (``<think>\n`` is one or two tokens in the families that do; a few more cost nothing).
PROMPT_TAIL_TOKENS = 8


@dataclass
class GatewayState:
    config: GatewayConfig
    store: Store
    engine: Engine
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)
    gate: PauseGate = field(default_factory=PauseGate)
    calls: CallsInFlight = field(default_factory=CallsInFlight)  # by rollout, for its end to cancel
    history: CallHistory = field(init=False)
    writer: CallWriter = field(init=False)  # makes answered calls durable (group commit)
    # This gateway's part in the gate every gateway sharing the store agrees on (``gateway.control.cluster``).
    cluster: Cluster = field(init=False)
    # Other gateway processes write into this store though it is a file (``--workers``).
    shared_store: bool = False
    formats: ModelFormats = field(init=False)  # the tool-call and reasoning formats answers are read in
    _tool_parser: ToolParserFactory = field(init=False, repr=False)
    _reasoning_parser: ReasoningParserFactory = field(init=False, repr=False)
    # Seconds between SSE comments while a streaming call waits at a paused gate (keeps proxies and
    # client read timeouts from giving up on a call that is merely waiting for new weights).
    keepalive_s: float = 10.0
    # Teacher mode (``gateway.teacher``): an upstream answers chat calls instead of the engine.
    teacher: Teacher | None = field(default=None, repr=False)
    started_at: float = field(default_factory=now)
    ready: bool = False
    # The server began to shut down (``stop``): a call that would wait at the gate is answered 503.
    stopping: bool = False
    # The event loop serving this app (set by the lifespan): code on other loops reaches the gate
    # and the engine through it (``gating.GatewayHandle``).
    loop: asyncio.AbstractEventLoop | None = None
    _drop_writes: set[asyncio.Task[None]] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        self.cluster = Cluster(
            self.store,
            self.gate,
            self.engine,
            lease_s=self.config.lease_s,
            shared=self.shared_store,
            gate_name=self.config.gate,
        )
        self.metrics.read_gauges_from(self.gate, self.engine)
        # Another gateway may have recorded this rollout's latest calls: check the store.
        self.history = CallHistory(self.store, check_store=self.cluster.shares_store)
        self.formats = resolve_formats(
            self.config.tool_call_parser,
            self.config.reasoning_parser,
            self.engine.tokenizer.chat_template,
        )
        self._tool_parser = get_tool_parser(self.formats.tool_parser)
        self._reasoning_parser = get_reasoning_parser(self.formats.reasoning_parser)
        self.writer = CallWriter(self.store)

    def stop(self) -> int:
        """The server began to shut down: answer the calls held at the pause gate now (503
        ``gateway_stopping``, dropped) rather than after the graceful timeout, and every later call
        that would wait there too. Calls already generating go on and are recorded. Returns how
        many were held. On the event loop (``transport.serving.GatewayServer``)."""
        self.stopping = True
        return self.calls.stop_held()

    def tool_parser(self, tools: Tools) -> ToolParser:
        """A parser for one answer, its malformed calls counted in ``harnessrl_tool_calls_malformed``."""
        counter = self.metrics.child(self.metrics.malformed_tool_calls, self.formats.tool_parser)
        return CountingParser(self._tool_parser(tools), counter.inc)

    def reasoning_parser(self, prompt_ids: Sequence[int]) -> ReasoningParser:
        """A parser for one answer to ``prompt_ids``, inside the reasoning block if the prompt opened it."""
        tail = self.engine.tokenizer.decode(prompt_ids[-PROMPT_TAIL_TOKENS:])
        factory = self._reasoning_parser
        return factory(starts_in_reasoning=factory.prompt_opens_reasoning(tail))

    def count_drop(self, rollout_id: str, api: str, reason: DropReason, token_ids: Collection[int]) -> None:
        """Count a dropped call: in the metrics now, in the rollout's ``metadata.dropped_calls`` (the
        trainer's count) by a store write in the background."""
        m = self.metrics
        m.child(m.dropped, api, reason).inc()
        m.dropped_tokens.inc(len(token_ids))
        if reason == "client_gone":
            m.disconnects.inc()
        task = asyncio.ensure_future(self._write_drop(rollout_id, reason))
        self._drop_writes.add(task)
        task.add_done_callback(self._drop_writes.discard)

    async def _write_drop(self, rollout_id: str, reason: str) -> None:
        try:
            await self.in_thread(self.store.count_dropped_call, rollout_id, reason)
        except Exception:  # noqa: BLE001 - a count must not fail anything; the metric has it
            log.warning(
                "could not count a dropped call of rollout %s in the store", rollout_id, exc_info=True
            )

    async def drops_written(self) -> None:
        """Wait for the background writes of drop counts (shutdown, tests)."""
        while self._drop_writes:
            await asyncio.gather(*self._drop_writes, return_exceptions=True)

    async def in_thread(self, fn: Callable[..., T], *args: object) -> T:
        """Run a blocking store call off the event loop (the store's methods are thread-safe)."""
        return await anyio.to_thread.run_sync(fn, *args)

    def public_url(self, request_base_url: str) -> str:
        """Where harnesses reach this gateway: the configured URL, else the URL the caller used."""
        return (self.config.public_url or request_base_url).rstrip("/")

    def uptime(self) -> float:
        return now() - self.started_at
