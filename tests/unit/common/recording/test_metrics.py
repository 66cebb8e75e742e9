"""The recording's Prometheus metrics read the recorder's and collector's counters when scraped."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from services.common.recording.collect import Collector
from services.common.recording.metrics import RecordingMetrics
from services.common.recording.settings import RecordingSettings
from tests.helpers.recording import Exported
from tests.unit.common.recording.recorders import recorder


def scrape(metrics: RecordingMetrics) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(metrics)
    out: dict[str, float] = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_buffer_fill_and_capacity_are_scraped_as_they_are_now() -> None:
    gateway = recorder("gateway", capacity=50)
    collector = Collector(gateway, RecordingSettings(), Exported(), "gateway-id")  # type: ignore[arg-type]
    before = scrape(RecordingMetrics(gateway, collector))
    assert before["meshserve_tracing_buffer_spans"] == 0
    assert before["meshserve_tracing_buffer_capacity_spans"] == 50
    with gateway.get_tracer("g").start_as_current_span("rpc"):
        pass
    after = scrape(RecordingMetrics(gateway, collector))
    assert after["meshserve_tracing_buffer_spans"] == gateway.buffer.size >= 1
