"""GPU metrics: the NVML collector's names and units, and a clean no-op where there is no GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from services.model.gpu_metrics import NvmlCollector, register_gpu_metrics


class StandInNvml:
    """Answers the four NVML calls the collector makes, as the NVML library does for two GPUs."""

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=[35, 90][handle], memory=10)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=[1 << 30, 2 << 30][handle], total=80 << 30, free=0)


def test_collector_reports_ratio_and_bytes_per_gpu() -> None:
    families = {f.name: f for f in NvmlCollector(StandInNvml()).collect()}
    util = {s.labels["gpu"]: s.value for s in families["meshserve_gpu_utilization_ratio"].samples}
    used = {s.labels["gpu"]: s.value for s in families["meshserve_gpu_memory_used_bytes"].samples}
    assert util == {"0": 0.35, "1": 0.9}
    assert used == {"0": float(1 << 30), "1": float(2 << 30)}
    assert {s.value for s in families["meshserve_gpu_memory_total_bytes"].samples} == {float(80 << 30)}


def test_no_gpu_registers_nothing() -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        has_gpu = pynvml.nvmlDeviceGetCount() > 0
    except Exception:
        has_gpu = False
    if has_gpu:
        pytest.skip("this machine has a GPU")
    assert register_gpu_metrics() is False
