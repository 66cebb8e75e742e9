"""The gateway's long-lived channels to the model, feature and cache services, deadlines and headers per hop."""

from __future__ import annotations

import time
from collections.abc import Sequence

import grpc
from opentelemetry import propagate

from services.cache.client import CacheClient
from services.common.errors import DeadlineExceeded, MeshserveError, error_with_code
from services.common.server import transport_options
from services.gateway.settings import GatewaySettings
from services.protos import feature_pb2_grpc, inference_pb2_grpc

# Incoming headers passed on to every hop: canary routing, W3C trace context, request ids. (A call for an
# explicit model version also carries `x-model-version`, so the mesh can route it to the subset serving it.)
PASSED_HEADERS = ("x-canary", "traceparent", "tracestate", "baggage", "x-request-id")


def channel_options(settings: GatewaySettings) -> list[tuple[str, int]]:
    return [
        *transport_options(settings),
        # Reconnect within a second or two when a service comes back (grpc's default backoff grows to 120 s).
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        # Do not let grpcio itself retry: retries are the mesh's job (Envoy retry policy).
        ("grpc.enable_retries", 0),
    ]


class Upstreams:
    """One channel per service, opened at start and kept (HTTP/2 multiplexes every request over it)."""

    def __init__(self, settings: GatewaySettings) -> None:
        options = channel_options(settings)
        self.model_channel = grpc.aio.insecure_channel(settings.model_address, options=options)
        self.feature_channel = grpc.aio.insecure_channel(settings.feature_address, options=options)
        self.cache_channel = grpc.aio.insecure_channel(settings.cache_address, options=options)
        self.model = inference_pb2_grpc.GRPCInferenceServiceStub(self.model_channel)
        self.feature = feature_pb2_grpc.FeatureServiceStub(self.feature_channel)
        self.cache = CacheClient(settings.cache_address, channel=self.cache_channel)

    async def close(self) -> None:
        for channel in (self.model_channel, self.feature_channel, self.cache_channel):
            await channel.close()


def outgoing_headers(incoming: Sequence[tuple[str, str | bytes]] | None) -> tuple[tuple[str, str], ...]:
    """Headers for the next hop: the passed-through ones, then the current span's trace context (if tracing)."""
    carrier = {k: v for k, v in (incoming or ()) if k in PASSED_HEADERS and isinstance(v, str)}
    propagate.inject(carrier)
    return tuple(carrier.items())


def hop_headers(headers: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """`headers` with the trace context of the current span (the hop's own span), so the callee is its child."""
    carrier = dict(headers)
    propagate.inject(carrier)
    return tuple(carrier.items())


class Deadline:
    """What is left of the caller's deadline (and the pipeline's total), handed to each hop."""

    def __init__(self, total_s: float, caller_remaining_s: float | None) -> None:
        budget = total_s if caller_remaining_s is None else min(total_s, caller_remaining_s)
        self.end = time.monotonic() + budget

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def for_hop(self, stage_ms: float, what: str) -> float:
        """Timeout of one hop: its stage limit or what is left, whichever is smaller."""
        left = self.remaining()
        if left <= 0:
            raise DeadlineExceeded(f"deadline passed before {what}")
        return min(stage_ms / 1000.0, left)


def upstream_error(service: str, exc: grpc.aio.AioRpcError) -> MeshserveError:
    """An upstream failure passed on with its status code (the mesh's retry/ejection semantics hold)."""
    return error_with_code(exc.code(), f"{service}: {exc.details() or exc.code().name}")
