"""Prometheus metrics of one gateway app, in its own ``CollectorRegistry``.

A registry per app (not the process-global default) so several gateways in one process (tests,
benchmarks) never collide or share counts. ``merge_worker_metrics`` joins the scrapes of a
``--workers`` gateway's processes into one answer, each series labelled with its ``worker``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class GatewayMetrics:
    def __init__(self) -> None:
        self._children: dict[tuple[Any, ...], Any] = {}  # (metric id, label values) -> child
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.calls = Counter(
            "harnessrl_calls", "Model calls answered and recorded", ["api", "finish_reason"], registry=r
        )
        self.prompt_tokens = Counter("harnessrl_prompt_tokens", "Prompt tokens of answered calls", registry=r)
        self.completion_tokens = Counter(
            "harnessrl_completion_tokens", "Sampled tokens of answered calls", registry=r
        )
        self.latency = Histogram(
            "harnessrl_call_latency_seconds",
            "Generation start to last token, per answered call",
            ["api"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.first_token = Histogram(
            "harnessrl_time_to_first_token_seconds",
            "Generation start to first sampled token",
            ["api"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.pause_wait = Histogram(
            "harnessrl_pause_wait_seconds",
            "Time a call waited at the pause gate",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge("harnessrl_calls_in_flight", "Model calls generating now", registry=r)
        self.waiting = Gauge("harnessrl_calls_waiting", "Model calls held by a pause", registry=r)
        self.paused = Gauge("harnessrl_paused", "1 while the gateway is paused", registry=r)
        self.policy_version = Gauge(
            "harnessrl_policy_version", "Policy version the engine serves", registry=r
        )
        self.errors = Counter("harnessrl_errors", "Error responses by code", ["code"], registry=r)
        self.reuse = Counter(
            "harnessrl_prompt_reuse",
            "How chat prompts were tokenized: reused (sampled IDs spliced in), first (no earlier call), "
            "no_match (history matches no earlier call), mismatch (matched but the template did not line up), "
            "as_rendered (history = as_rendered: never spliced)",
            ["result"],
            registry=r,
        )
        self.malformed_tool_calls = Counter(
            "harnessrl_tool_calls_malformed",
            "Tool calls the policy wrote but did not finish or form (returned to the harness as text)",
            ["parser"],
            registry=r,
        )
        self.disconnects = Counter(
            "harnessrl_client_disconnects",
            "Model calls whose client left before the answer's end, streamed or not (not recorded)",
            registry=r,
        )
        self.dropped = Counter(
            "harnessrl_calls_dropped",
            "Model calls cancelled and not recorded, by reason: client_gone, slow_reader, rollout_ended, "
            "gateway_lapsed, gateway_stopping",
            ["api", "reason"],
            registry=r,
        )
        self.dropped_tokens = Counter(
            "harnessrl_dropped_tokens",
            "Tokens the engine had sampled for calls that were then dropped (generation cancelled)",
            registry=r,
        )

    def child(self, metric: Any, *label_values: str) -> Any:
        """``metric.labels(*label_values)``, kept: the hot path counts each model call in several
        labelled metrics, and prometheus_client's ``labels`` takes a lock and rebuilds the key."""
        key = (id(metric), *label_values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*label_values)
        return child

    def count_answered(self, api: str, call: Any) -> None:
        """A recorded call (the policy's or a teacher's) in the call metrics: by API and finish reason,
        its tokens, latency and time to first token."""
        self.child(self.calls, api, call.finish_reason).inc()
        if call.usage is not None:
            self.prompt_tokens.inc(call.usage.prompt_tokens)
            self.completion_tokens.inc(call.usage.completion_tokens)
        if call.finished_at is not None:
            self.child(self.latency, api).observe(call.finished_at - call.started_at)
        if call.first_token_at is not None:
            self.child(self.first_token, api).observe(call.first_token_at - call.started_at)

    def read_gauges_from(self, gate: Any, engine: Any) -> None:
        """Read the gate's and the engine's state when the metrics are rendered, not kept up to date
        call by call (a gauge set takes a lock; a call changed ``in_flight`` twice)."""
        self.in_flight.set_function(lambda: gate.in_flight)
        self.waiting.set_function(lambda: gate.waiting)
        self.paused.set_function(lambda: 1 if gate.paused else 0)
        self.policy_version.set_function(lambda: engine.policy_version)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Families:
    """A collector yielding already-built metric families (``merge_worker_metrics``)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def merge_worker_metrics(scrapes: Sequence[str | None]) -> bytes:
    """One exposition of every worker's: ``scrapes[i]`` is worker ``i``'s ``/metrics`` text (``None``:
    it did not answer). Each series gains the label ``worker="i"`` (so every counter is one worker's
    and never goes backwards between scrapes: sum them over ``worker``), and
    ``harnessrl_worker_up{worker}`` says which answered."""
    families: dict[str, Metric] = {}
    up = Metric("harnessrl_worker_up", "1 if this gateway worker process answered the scrape", "gauge")
    for index, text in enumerate(scrapes):
        worker = str(index)
        up.samples.append(Sample("harnessrl_worker_up", {"worker": worker}, 0.0 if text is None else 1.0))
        for family in text_string_to_metric_families(text or ""):
            merged = families.setdefault(
                family.name, Metric(family.name, family.documentation, family.type, family.unit)
            )
            merged.samples += [
                sample._replace(labels={**sample.labels, "worker": worker}) for sample in family.samples
            ]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families([*families.values(), up]))
    return generate_latest(registry)
