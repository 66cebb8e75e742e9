"""Every test here needs an NVIDIA GPU: without one each is skipped with the one-line reason NVML gives."""

from __future__ import annotations

import pytest

from services.model.backends.gpu import why_no_gpu


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = why_no_gpu()
    for item in items:
        if "tests/gpu/" not in item.nodeid.replace("\\", "/"):
            continue
        item.add_marker(pytest.mark.gpu)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"no GPU: {reason}"))
