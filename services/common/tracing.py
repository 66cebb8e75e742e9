"""Tracing set up from the standard OTEL_* variables and MESHSERVE_TRACING_*: off, head sampling (the OpenTelemetry
SDK exporting every sampled span over OTLP/gRPC), or always-on recording with retroactive collection (Recorder)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import secrets
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from prometheus_client import REGISTRY

from services.common.recording import (
    AdminServer,
    Collector,
    OtlpExporter,
    ParentPropagator,
    RecordedSpan,
    Recorder,
    RecordingMetrics,
    RecordingSettings,
    current_span,
)

log = logging.getLogger(__name__)


def tracing_enabled() -> bool:
    """Tracing is on when an OTLP endpoint is configured and neither the SDK nor the exporter is disabled."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def setup_tracing(service_name: str, settings: RecordingSettings | None = None) -> TracerProvider | Recorder | None:
    """Install the global tracer provider; None (no spans, no cost) when no OTLP endpoint is configured.

    Head mode: the SDK reads OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG (e.g. parentbased_traceidratio),
    OTEL_EXPORTER_OTLP_* (endpoint, headers, insecure) and OTEL_BSP_* (batching). Retroactive mode
    (MESHSERVE_TRACING_MODE, see RecordingSettings): a Recorder records every request, exports what its caller
    sampled, and keeps the rest in memory for collection (start it with RecordingRuntime); the sampler variables do
    not apply (the edge's triggers and baseline decide).
    """
    if not tracing_enabled():
        log.info("tracing off (set OTEL_EXPORTER_OTLP_ENDPOINT to export spans)")
        return None
    settings = settings or RecordingSettings()
    name = os.environ.get("OTEL_SERVICE_NAME", service_name)
    resource = Resource.create({SERVICE_NAME: name})
    if settings.retroactive:
        recorder = Recorder(
            name,
            resource.attributes,
            settings.buffer_spans,
            settings.remember_evicted,
            settings.max_kept_per_s,
            settings.max_pending,
            settings.export_max_spans,
        )
        trace.set_tracer_provider(recorder)
        if settings.gc_young_threshold:
            gc.set_threshold(settings.gc_young_threshold, *gc.get_threshold()[1:])
        if settings.parent_header:
            propagate.set_global_textmap(ParentPropagator(propagate.get_global_textmap()))
        log.info(
            "tracing on: service.name=%s, recording (%d spans) for retroactive collection", name, len(settings.peers)
        )
        return recorder
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    log.info("tracing on: service.name=%s, head sampling", name)
    return provider


def shutdown_tracing(provider: TracerProvider | Recorder | None) -> None:
    """Flush and stop the SDK's exporter (at the end of a graceful shutdown; a Recorder's runtime closes itself)."""
    if isinstance(provider, TracerProvider):
        provider.shutdown()


class RecordingRuntime:
    """What a Recorder needs beside the serving path: its collector and OTLP exporter, and its admin endpoint (on the
    metrics port) where other processes' collectors read its buffer. start() inside the event loop."""

    def __init__(self, recorder: Recorder, settings: RecordingSettings | None = None) -> None:
        self.recorder = recorder
        self.settings = settings or RecordingSettings()
        self.instance_id = secrets.token_hex(8)
        self.collector: Collector | None = None
        self.admin: AdminServer | None = None
        self._metrics: RecordingMetrics | None = None

    def start(self, host: str, port: int) -> int | None:
        """Start collecting and serve the admin endpoint (with /metrics) on `port`; its bound port (None: port 0,
        no endpoint: this process's buffer cannot be collected by others)."""
        self.collector = Collector(self.recorder, self.settings, OtlpExporter(), self.instance_id)
        self.collector.start()
        self._metrics = RecordingMetrics(self.recorder, self.collector)
        REGISTRY.register(self._metrics)
        if port == 0:
            log.warning("no metrics port: this process's recorded spans cannot be collected by other processes")
            return None
        self.admin = AdminServer(self.recorder, self.instance_id, host, port)
        bound = self.admin.start()
        log.info("metrics and trace collection on http://%s:%d (/metrics, /recording/collect)", host, bound)
        return bound

    async def close(self) -> None:
        """Collect what is pending, export the sampled spans; the admin endpoint stops last (other collectors may
        still ask this process)."""
        if self.collector is not None:
            await self.collector.close()
        if self.admin is not None:
            await asyncio.to_thread(self.admin.stop)
        if self._metrics is not None:
            REGISTRY.unregister(self._metrics)


def child_span(
    tracer: trace.Tracer, name: str, attributes: Mapping[str, Any] | None = None
) -> AbstractContextManager[trace.Span]:
    """A child of the current span when that one is sampled or recorded; otherwise no span at all, so unsampled
    requests (and services with tracing off) pay nothing. Works after the parent ended (off-path work such as a
    store)."""
    current = current_span()
    if type(current) is RecordedSpan:
        return current.recorder.child(_scope(tracer), name, attributes)
    if not current.get_span_context().trace_flags.sampled:
        return contextlib.nullcontext(trace.INVALID_SPAN)
    return tracer.start_as_current_span(name, attributes=attributes)


_scopes: dict[int, str] = {}


def _scope(tracer: trace.Tracer) -> str:
    """The instrumentation scope a (proxy) tracer was asked for (tracers live as long as their modules)."""
    scope = _scopes.get(id(tracer))
    if scope is None:
        name = getattr(tracer, "_instrumenting_module_name", None) or getattr(tracer, "scope", "meshserve")
        scope = _scopes[id(tracer)] = str(name)
    return scope
