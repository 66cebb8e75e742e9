"""Prometheus metrics of a process's recording and collection, read from their counters when scraped (nothing is
counted on the serving path)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as PrometheusCollector

from services.common.recording.collect import Collector
from services.common.recording.provider import Recorder


class RecordingMetrics(PrometheusCollector):
    """meshserve_tracing_*: buffer fill and evictions, kept traces by trigger, dropped keeps and sampled spans,
    collections by outcome, exported spans and failed exports."""

    def __init__(self, recorder: Recorder, collector: Collector) -> None:
        self.recorder = recorder
        self.collector = collector

    def collect(self) -> Iterator[Metric]:
        recorder, collector = self.recorder, self.collector
        yield GaugeMetricFamily(
            "meshserve_tracing_buffer_spans", "Spans held in this process's recording buffer.", recorder.buffer.size
        )
        yield GaugeMetricFamily(
            "meshserve_tracing_buffer_capacity_spans",
            "Spans the recording buffer holds at most.",
            recorder.buffer.capacity,
        )
        yield CounterMetricFamily(
            "meshserve_tracing_evicted_traces",
            "Traces whose spans rolled out of the recording buffer uncollected.",
            recorder.buffer.evictions,
        )
        kept = CounterMetricFamily("meshserve_tracing_kept", "Traces kept here, by trigger.", labels=["trigger"])
        for trigger, count in sorted(recorder.kept_total.items()):
            kept.add_metric([trigger], count)
        yield kept
        yield CounterMetricFamily(
            "meshserve_tracing_keep_dropped",
            "Keeps refused by the rate limit (MESHSERVE_TRACING_MAX_KEPT_PER_S) or a full queue.",
            recorder.keep_dropped,
        )
        yield CounterMetricFamily(
            "meshserve_tracing_sampled_dropped",
            "Head-sampled spans dropped because the export queue was full.",
            recorder.sampled_dropped,
        )
        collected = CounterMetricFamily(
            "meshserve_tracing_collected", "Kept traces collected and exported, by outcome.", labels=["outcome"]
        )
        for outcome, count in sorted(collector.collected.items()):
            collected.add_metric([outcome], count)
        yield collected
        yield CounterMetricFamily(
            "meshserve_tracing_exported_spans", "Spans exported over OTLP.", collector.exporter.exported_spans
        )
        yield CounterMetricFamily(
            "meshserve_tracing_export_failures", "OTLP exports that failed.", collector.exporter.failures
        )
