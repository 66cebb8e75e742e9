"""Prometheus metrics shared by every service: the /metrics endpoint and per-RPC counters and latencies."""

from __future__ import annotations

import logging

import grpc
from opentelemetry import trace
from prometheus_client import Counter, Histogram, start_http_server

log = logging.getLogger(__name__)

# Latency buckets from 100 µs to 10 s: fine enough below a millisecond for p99 of fast RPCs.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01,
    0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

GRPC_HANDLED = Counter(
    "meshserve_grpc_server_handled_total",
    "RPCs completed on the server, by method and gRPC status code.",
    ["service", "method", "code"],
)
GRPC_HANDLING = Histogram(
    "meshserve_grpc_server_handling_seconds",
    "Time to handle an RPC on the server (successful or not).",
    ["service", "method"],
    buckets=LATENCY_BUCKETS,
)


def trace_exemplar() -> dict[str, str] | None:
    """{"trace_id": ...} of the current sampled span, to link a latency observation to its trace (an
    OpenMetrics exemplar, shown when Prometheus scrapes with exemplar storage on); None otherwise."""
    context = trace.get_current_span().get_span_context()
    if not (context.is_valid and context.trace_flags.sampled):
        return None
    return {"trace_id": format(context.trace_id, "032x")}


class RpcMetrics:
    """Label children cached per (method, code) so the hot path pays one dict lookup, not a label lookup."""

    def __init__(self, service: str) -> None:
        self.service = service
        self._handled: dict[tuple[str, grpc.StatusCode], Counter] = {}
        self._handling: dict[str, Histogram] = {}

    def observe(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        key = (method, code)
        counter = self._handled.get(key)
        if counter is None:
            counter = GRPC_HANDLED.labels(self.service, method, code.name)
            self._handled[key] = counter
        counter.inc()
        hist = self._handling.get(method)
        if hist is None:
            hist = GRPC_HANDLING.labels(self.service, method)
            self._handling[method] = hist
        hist.observe(seconds, trace_exemplar())


def start_metrics_server(port: int, host: str = "0.0.0.0") -> int | None:
    """Serve /metrics on a background thread; returns the bound port (None when disabled)."""
    if port == 0:
        return None
    server, _thread = start_http_server(port, addr=host)
    bound = server.server_address[1]
    log.info("metrics on http://%s:%d/metrics", host, bound)
    return int(bound)
