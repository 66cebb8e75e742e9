"""GPU utilisation and memory from NVML as Prometheus gauges (only registered when a GPU is present)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client.core import REGISTRY, GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)


class Nvml(Protocol):
    """The NVML calls the collector makes (the `pynvml` module provides them)."""

    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...


class NvmlCollector(Collector):
    """Reads NVML on each scrape: utilisation ratio, memory used and total per GPU."""

    def __init__(self, pynvml: Nvml) -> None:
        self.nvml = pynvml
        self.count = pynvml.nvmlDeviceGetCount()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        util = GaugeMetricFamily("meshserve_gpu_utilization_ratio", "GPU busy ratio (0..1) from NVML.", labels=["gpu"])
        used = GaugeMetricFamily("meshserve_gpu_memory_used_bytes", "GPU memory in use.", labels=["gpu"])
        total = GaugeMetricFamily("meshserve_gpu_memory_total_bytes", "GPU memory in total.", labels=["gpu"])
        for i in range(self.count):
            handle = self.nvml.nvmlDeviceGetHandleByIndex(i)
            rates = self.nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
            util.add_metric([str(i)], rates.gpu / 100.0)
            used.add_metric([str(i)], float(memory.used))
            total.add_metric([str(i)], float(memory.total))
        yield util
        yield used
        yield total


def register_gpu_metrics() -> bool:
    """Register the NVML collector if NVML and at least one GPU are present; False otherwise."""
    try:
        import pynvml

        pynvml.nvmlInit()
        collector = NvmlCollector(pynvml)
    except Exception as exc:  # no driver, no library, no GPU: nothing to report
        log.debug("no NVML: %s", exc)
        return False
    if collector.count == 0:
        return False
    REGISTRY.register(collector)
    log.info("GPU metrics from NVML for %d GPU(s)", collector.count)
    return True
