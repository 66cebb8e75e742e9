"""Tracing set-up from the standard OTEL_* variables, and child spans that cost nothing when unsampled."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.common import tracing
from services.common.tracing import child_span, setup_tracing, shutdown_tracing, tracing_enabled

OTEL = [
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_SERVICE_NAME",
]


@pytest.fixture()
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No OTEL_* variables."""
    for name in OTEL:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture()
def installed(monkeypatch: pytest.MonkeyPatch) -> list[trace.TracerProvider]:
    """Global tracer providers that setup_tracing installs, recorded instead (a process gets only one)."""
    providers: list[trace.TracerProvider] = []
    monkeypatch.setattr(tracing.trace, "set_tracer_provider", providers.append)
    return providers


@pytest.mark.parametrize(
    ("variables", "enabled"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_SDK_DISABLED": "TRUE"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_SDK_DISABLED": "false"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_TRACES_EXPORTER": " none "}, False),
    ],
)
def test_tracing_enabled(env: pytest.MonkeyPatch, variables: dict[str, str], enabled: bool) -> None:
    for name, value in variables.items():
        env.setenv(name, value)
    assert tracing_enabled() is enabled


def test_setup_without_an_endpoint_installs_nothing(
    env: pytest.MonkeyPatch, installed: list[trace.TracerProvider]
) -> None:
    assert setup_tracing("model") is None
    assert installed == []
    shutdown_tracing(None)


@pytest.mark.parametrize(("service_name", "expected"), [(None, "cache"), ("cache-v2", "cache-v2")])
def test_setup_installs_an_otlp_exporting_provider(
    env: pytest.MonkeyPatch, installed: list[trace.TracerProvider], service_name: str | None, expected: str
) -> None:
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    if service_name is not None:
        env.setenv("OTEL_SERVICE_NAME", service_name)
    provider = setup_tracing("cache")
    assert isinstance(provider, TracerProvider)
    assert installed == [provider]
    assert provider.resource.attributes["service.name"] == expected
    shutdown_tracing(provider)  # nothing was exported: returns at once


def test_child_span_only_under_a_sampled_parent() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with child_span(tracer, "cache.lookup") as none:
        assert none is trace.INVALID_SPAN  # no parent: no span at all
    with tracer.start_as_current_span("rpc") as parent:
        pass
    # After the parent ended (work off the request path): still its child.
    with trace.use_span(parent), child_span(tracer, "cache.store", {"entries": 2}) as child:
        assert child.get_span_context().is_valid
    stored = {s.name: s for s in exporter.get_finished_spans()}
    assert stored["cache.store"].parent is not None
    assert stored["cache.store"].parent.span_id == parent.get_span_context().span_id
    assert stored["cache.store"].attributes == {"entries": 2}
    unsampled = trace.NonRecordingSpan(
        trace.SpanContext(1, 2, is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.DEFAULT))
    )
    with trace.use_span(unsampled), child_span(tracer, "cache.lookup") as skipped:
        assert skipped is trace.INVALID_SPAN
