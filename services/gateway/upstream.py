"""The gateway's upstreams: what it needs from the cache, feature and model services, the long-lived channels
to them, and what each hop is handed (the rest of the deadline, the passed-on headers)."""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import AsyncGenerator, Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import grpc
from opentelemetry import propagate

from services.cache.api import CacheClient, CachedValue, Invalidation, StoreItem
from services.common.errors import DeadlineExceeded
from services.common.server import transport_options
from services.feature.api import FeatureClient, FeatureMatrix, FieldValue
from services.gateway.settings import GatewaySettings
from services.model.api import InferResult, ModelClient, ModelInfo, RawTensor

log = logging.getLogger(__name__)
Headers = Sequence[tuple[str, str]]

# Incoming headers passed on to every hop: canary routing, W3C trace context, request ids. (A call for an
# explicit model version also carries `x-model-version`, so the mesh can route it to the subset serving it.)
PASSED_HEADERS = ("x-canary", "traceparent", "tracestate", "baggage", "x-request-id")
# Housekeeping calls (version refresh, warm-up, the near cache's watch) carry an unsampled W3C context: the
# mesh must not trace them.
UNTRACED = (("traceparent", f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-00"),)
WARM_UP_TIMEOUT_S = 2.0


class CacheUpstream(Protocol):
    """The cache calls of a pipeline request (CacheClient: lookups fail open, so they never raise but for
    InvalidArgument)."""

    async def lookup(
        self,
        keys: Sequence[bytes],
        pipeline: str = "",
        allow_stale: bool = False,
        budget_ms: float = 0.0,
        timeout_s: float | None = None,
        metadata: Headers = (),
    ) -> list[CachedValue | None]: ...

    async def store_many(
        self, items: Sequence[StoreItem], *, timeout_s: float | None = None, metadata: Headers = ()
    ) -> int: ...


class WatchUpstream(Protocol):
    """The cache's invalidation stream (CacheClient.watch): ends, or raises MeshserveError, when lost (also when
    silent for heartbeat_timeout_s)."""

    def watch(
        self, metadata: Headers = (), *, heartbeat_timeout_s: float | None = None
    ) -> AsyncGenerator[Invalidation, None]: ...


class FeatureUpstream(Protocol):
    """The feature call of a pipeline request (FeatureClient): raises MeshserveError with the service's code."""

    async def compute(
        self,
        feature_set: str,
        rows: Sequence[Mapping[str, FieldValue]],
        budget_ms: float = 0.0,
        *,
        timeout_s: float | None = None,
        metadata: Headers = (),
    ) -> FeatureMatrix: ...


class ReadinessUpstream(Protocol):
    """ModelReady through the mesh (ModelClient.ready), the activator's probe: raises MeshserveError with the status
    it got."""

    async def ready(
        self, model: str, version: str = "", *, timeout_s: float | None = None, metadata: Headers = ()
    ) -> bool: ...


class ModelUpstream(ReadinessUpstream, Protocol):
    """The model call of a pipeline request (ModelClient), and the model's readiness while it has no serving replica
    (services/gateway/activator.py): raises MeshserveError with the service's code."""

    async def infer(
        self,
        model: str,
        version: str,
        inputs: Sequence[RawTensor],
        *,
        timeout_s: float | None = None,
        metadata: Headers = (),
    ) -> InferResult: ...


class DescribeUpstream(Protocol):
    """ModelMetadata in plain types (ModelClient.describe), for the version refresher."""

    async def describe(
        self, model: str, version: str = "", *, timeout_s: float | None = None, metadata: Headers = ()
    ) -> ModelInfo: ...


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


@dataclass
class Upstreams:
    """One client per service, each over a channel opened at start and kept (HTTP/2 multiplexes every request)."""

    cache: CacheClient
    feature: FeatureClient
    model: ModelClient
    channels: Sequence[grpc.aio.Channel] = field(default_factory=tuple)

    @classmethod
    def connect(cls, settings: GatewaySettings) -> Upstreams:
        options = channel_options(settings)
        model = grpc.aio.insecure_channel(settings.model_address, options=options)
        feature = grpc.aio.insecure_channel(settings.feature_address, options=options)
        cache = grpc.aio.insecure_channel(settings.cache_address, options=options)
        return cls(
            cache=CacheClient(settings.cache_address, channel=cache),
            feature=FeatureClient(feature),
            model=ModelClient(model),
            channels=(model, feature, cache),
        )

    async def warm_up(self, feature_sets: Iterable[str]) -> None:
        """One cheap call per upstream, through the mesh when there is one (it connects both hops), so the first
        requests do not pay for connection set-up inside their tight stage budgets. Best effort."""
        calls: list[Awaitable[object]] = [self.cache.stats(timeout_s=WARM_UP_TIMEOUT_S, metadata=UNTRACED)]
        for feature_set in feature_sets:
            calls.append(self.feature.get_feature_set(feature_set, timeout_s=WARM_UP_TIMEOUT_S, metadata=UNTRACED))
        for result in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(result, BaseException):
                log.info("upstream not reachable yet (requests will retry the connection): %s", result)

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()


def passed_headers(incoming: Sequence[tuple[str, str | bytes]] | None) -> tuple[tuple[str, str], ...]:
    """The incoming headers passed on to the next hops, as they came: a pipeline's hops each add their own span's
    trace context (services/gateway/joins.py), so none is added here."""
    return tuple((k, v) for k, v in (incoming or ()) if k in PASSED_HEADERS and isinstance(v, str))


def outgoing_headers(incoming: Sequence[tuple[str, str | bytes]] | None) -> tuple[tuple[str, str], ...]:
    """Headers for the next hop: the passed-through ones, then the current span's trace context (if tracing)."""
    carrier = {k: v for k, v in (incoming or ()) if k in PASSED_HEADERS and isinstance(v, str)}
    propagate.inject(carrier)
    return tuple(carrier.items())


def hop_headers(headers: Headers) -> tuple[tuple[str, str], ...]:
    """`headers` with the trace context of the current span (the hop's own span), so the callee is its child."""
    carrier = dict(headers)
    propagate.inject(carrier)
    return tuple(carrier.items())


class Deadline:
    """What is left of the caller's deadline (and the pipeline's total), handed to each hop. The pipeline's total
    budgets the gateway's work: time a request spends parked for a cold model is given back to it (`pause`), the
    caller's own deadline never moves."""

    def __init__(self, total_s: float, caller_remaining_s: float | None) -> None:
        now = time.monotonic()
        self.caller_end = math.inf if caller_remaining_s is None else now + caller_remaining_s
        self.end = min(now + total_s, self.caller_end)

    def pause(self, seconds: float) -> None:
        """Give `seconds` (spent waiting, not working) back to the pipeline's total, within the caller's deadline."""
        self.end = min(self.end + seconds, self.caller_end)

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def for_hop(self, stage_ms: float, what: str) -> float:
        """Timeout of one hop: its stage limit or what is left, whichever is smaller."""
        left = self.remaining()
        if left <= 0:
            raise DeadlineExceeded(f"deadline passed before {what}")
        return min(stage_ms / 1000.0, left)
