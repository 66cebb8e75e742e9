"""Prometheus metrics shared by every service: the /metrics endpoint and per-RPC counts, latencies and stream lives."""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import grpc
from opentelemetry import trace
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from services.common.internal_auth import guarded_wsgi, internal_token

log = logging.getLogger(__name__)

# Latency buckets from 100 µs to 10 s: fine enough below a millisecond for p99 of fast RPCs.
_MS = (0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 15, 20, 30, 50, 75, 100, 250, 500, 1000, 2500, 5000, 10000)
LATENCY_BUCKETS = tuple(ms / 1000 for ms in _MS)
# A streaming RPC (e.g. CacheService/Watch) lives from milliseconds to the whole life of a replica.
STREAM_BUCKETS = (0.01, 0.1, 1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)

GRPC_HANDLED = Counter(
    "meshserve_grpc_server_handled_total",
    "RPCs completed on the server, by method and gRPC status code.",
    ["service", "method", "code"],
)
GRPC_HANDLING = Histogram(
    "meshserve_grpc_server_handling_seconds",
    "Time to handle a unary-response RPC on the server (successful or not).",
    ["service", "method"],
    buckets=LATENCY_BUCKETS,
)
# Apart from the handling histogram, so that a long-lived stream never counts against the RPC latency SLO.
GRPC_STREAM = Histogram(
    "meshserve_grpc_server_stream_seconds",
    "How long a response-streaming RPC stayed open on the server (until it ended, failed or was cancelled).",
    ["service", "method"],
    buckets=STREAM_BUCKETS,
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
        self._streams: dict[str, Histogram] = {}

    def _count(self, method: str, code: grpc.StatusCode) -> None:
        key = (method, code)
        counter = self._handled.get(key)
        if counter is None:
            counter = GRPC_HANDLED.labels(self.service, method, code.name)
            self._handled[key] = counter
        counter.inc()

    def observe(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        """A finished unary-response RPC: its count by code and its handling time."""
        self._count(method, code)
        hist = self._handling.get(method)
        if hist is None:
            hist = GRPC_HANDLING.labels(self.service, method)
            self._handling[method] = hist
        hist.observe(seconds, trace_exemplar())

    def observe_stream(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        """A finished response stream: its count by code and how long it stayed open."""
        self._count(method, code)
        hist = self._streams.get(method)
        if hist is None:
            hist = GRPC_STREAM.labels(self.service, method)
            self._streams[method] = hist
        hist.observe(seconds, trace_exemplar())


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # a scrape every few seconds is not news
        pass


def start_metrics_server(
    port: int, host: str = "0.0.0.0", token: str | None = None, registry: CollectorRegistry = REGISTRY
) -> int | None:
    """Serve /metrics (of `registry`) on a background thread; returns the bound port (None when disabled).

    With the internal credential (`token`, by default this process's MESHSERVE_INTERNAL_TOKEN) a scrape without
    `Authorization: Bearer <token>` gets 401 (services.common.internal_auth); without one it is open.
    """
    if port == 0:
        return None
    token = internal_token() if token is None else token

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    app = guarded_wsgi(make_wsgi_app(registry), token)
    server = make_server(host, port, app, Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    bound = server.server_address[1]
    log.info("metrics on http://%s:%d/metrics%s", host, bound, " (internal credential required)" if token else "")
    return int(bound)
