"""Unit tests run in this process only: while they run, starting a process fails and says where the test belongs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.unit.no_spawn import SpawnGuard


@pytest.fixture(scope="package", autouse=True)
def spawn_guard() -> Iterator[SpawnGuard]:
    """Installed before any fixture of tests/unit is set up, and removed after its last test (so tests/manifests,
    which runs kubectl in the same pytest process, is not affected)."""
    with SpawnGuard().installed() as guard:
        yield guard


@pytest.fixture(autouse=True)
def no_spawn_attempt(spawn_guard: SpawnGuard) -> Iterator[None]:
    yield
    spawn_guard.check()
