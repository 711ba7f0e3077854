"""``/metrics``: the daemon's stats and ps in Prometheus text format (prometheus_client), and
a latency histogram of the HTTP requests this front door served."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from modeld.errors import ModeldError
from modeld.http.bridge import Bridge

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class StatsCollector(Collector):
    """Metric families built from one ``stats`` + ``ps`` answer."""

    def __init__(self) -> None:
        self.stats: dict[str, Any] = {}
        self.ps: dict[str, Any] = {}

    def collect(self) -> Any:
        s, rows = self.stats, self.ps.get("models", [])
        yield _counter("modeld_requests", "Requests the daemon accepted.", s.get("requests"))
        yield _counter("modeld_tokens_generated", "Tokens generated.", s.get("tokens_generated"))
        yield _counter("modeld_prompt_tokens", "Prompt tokens evaluated.", s.get("prompt_tokens"))
        yield _counter("modeld_loads", "Model loads.", s.get("loads"))
        yield _counter("modeld_load_failures", "Failed model loads.", s.get("load_failures"))
        yield _counter("modeld_load_seconds", "Seconds spent loading models.",
                       s.get("load_seconds_total"))
        yield _counter("modeld_runner_stalls", "Runners killed for silence.",
                       s.get("runner_stalls"))
        ev = CounterMetricFamily("modeld_evictions", "Evictions by reason.", labels=["reason"])
        for reason, n in sorted((s.get("evictions") or {}).items()):
            ev.add_metric([reason], float(n))
        yield ev
        for name, key, doc in (("modeld_budget_bytes", "budget_bytes", "Memory budget."),
                               ("modeld_used_bytes", "used_bytes", "Accounted memory in use."),
                               ("modeld_models_loaded", "models_loaded", "Models loaded."),
                               ("modeld_in_flight", "in_flight", "Requests being served."),
                               ("modeld_queue_depth", "waiting", "Requests waiting for room."),
                               ("modeld_uptime_seconds", "uptime_s", "Daemon uptime.")):
            yield GaugeMetricFamily(name, doc, value=float(s.get(key) or 0))
        yield from _devices(s)
        measured = GaugeMetricFamily("modeld_model_measured_bytes", "Measured bytes per model.",
                                     labels=["model", "mode"])
        vram = GaugeMetricFamily("modeld_model_vram_bytes", "Bytes on the GPUs per model "
                                 "(NVML's once measured, else the plan).", labels=["model", "mode"])
        ctx = GaugeMetricFamily("modeld_model_n_ctx", "Context length per model.",
                                labels=["model", "mode"])
        queued = GaugeMetricFamily("modeld_model_queued", "Requests queued per model.",
                                   labels=["model", "mode"])
        for row in rows:
            labels = [str(row.get("name")), str(row.get("mode"))]
            measured.add_metric(labels, float(row.get("measured_bytes") or 0))
            ctx.add_metric(labels, float(row.get("n_ctx") or 0))
            queued.add_metric(labels, float(row.get("queued") or 0))
            vram.add_metric(labels, float(row.get("size_vram") or 0))
        yield measured
        yield vram
        yield ctx
        yield queued


def _devices(s: dict[str, Any]) -> Any:
    """The backend (``modeld_backend{backend="CUDA"} 1``) and, per card, its memory: NVML's
    total and free, the cache's budget there, and what its models hold (measured where known)
    and were planned to hold."""
    backend = GaugeMetricFamily("modeld_backend", "The runners' llama.cpp backend.",
                                labels=["backend"])
    backend.add_metric([str(s.get("backend") or "CPU")], 1.0)
    yield backend
    families = [GaugeMetricFamily(f"modeld_vram_{what}_bytes", doc, labels=["device"])
                for what, doc in (("total", "A card's memory (NVML)."),
                                  ("free", "A card's free memory (NVML)."),
                                  ("budget", "What modeld's models may hold on a card."),
                                  ("used", "What modeld's models hold on a card (measured "
                                           "where known, else planned)."),
                                  ("estimate", "What modeld planned its models to hold on a "
                                               "card."))]  # fmt: skip
    cards = [d for d in s.get("devices") or [] if isinstance(d, dict) and "total_bytes" in d]
    for d in cards:
        for fam, key in zip(families, ("total", "free", "budget", "used", "estimate"),
                            strict=True):  # fmt: skip
            fam.add_metric([str(d.get("name"))], float(d.get(f"{key}_bytes") or 0))
    yield from families


def _counter(name: str, doc: str, value: object) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=float(value or 0))  # type: ignore[arg-type]


class Metrics:
    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        self.registry = CollectorRegistry(auto_describe=False)
        self.snapshot = StatsCollector()
        self.registry.register(self.snapshot)
        self.latency = Histogram(
            "modeld_http_request_seconds", "HTTP request latency (to the last byte).",
            ["route"], registry=self.registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))

    async def endpoint(self, request: Request) -> Response:
        try:
            self.snapshot.stats = await self.bridge.call("stats")
            self.snapshot.ps = await self.bridge.call("ps")
        except ModeldError as exc:
            return Response(f"# daemon unavailable: {exc.message}\n", status_code=503,
                            media_type=CONTENT_TYPE)
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE)

    def timer(self, app: Any, known: frozenset[str]) -> Any:
        """ASGI middleware observing each request's duration by route (``known`` paths only,
        the rest as "other": a label per random URL would grow without bound)."""
        async def timed(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            started = time.monotonic()
            try:
                await app(scope, receive, send)
            finally:
                path = str(scope.get("path", ""))
                self.latency.labels(path if path in known else "other").observe(
                    time.monotonic() - started)
        return timed
