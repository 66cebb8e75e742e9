"""OpenTelemetry tracing set up from the standard OTEL_* environment variables, exporting OTLP/gRPC."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

log = logging.getLogger(__name__)


def tracing_enabled() -> bool:
    """Tracing is on when an OTLP endpoint is configured and neither the SDK nor the exporter is disabled."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def setup_tracing(service_name: str) -> TracerProvider | None:
    """Install a global TracerProvider exporting OTLP/gRPC; None (no spans, no cost) when not configured.

    The SDK itself reads OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG (e.g. parentbased_traceidratio),
    OTEL_EXPORTER_OTLP_* (endpoint, headers, insecure) and OTEL_BSP_* (batching).
    """
    if not tracing_enabled():
        log.info("tracing off (set OTEL_EXPORTER_OTLP_ENDPOINT to export spans)")
        return None
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    name = os.environ.get("OTEL_SERVICE_NAME", service_name)
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    log.info("tracing on: service.name=%s", name)
    return provider


def shutdown_tracing(provider: TracerProvider | None) -> None:
    """Flush and stop the exporter (at the end of a graceful shutdown)."""
    if provider is not None:
        provider.shutdown()


def child_span(
    tracer: trace.Tracer, name: str, attributes: Mapping[str, Any] | None = None
) -> AbstractContextManager[trace.Span]:
    """A child of the current span when that one is sampled; otherwise no span at all, so unsampled requests
    (and services with tracing off) pay nothing. Works after the parent ended (off-path work such as a store)."""
    if not trace.get_current_span().get_span_context().trace_flags.sampled:
        return contextlib.nullcontext(trace.INVALID_SPAN)
    return tracer.start_as_current_span(name, attributes=attributes)
