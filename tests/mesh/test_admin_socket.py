"""Envoy's admin on a Unix socket only its owner may open (MeshTopology.admin `unix:/path`), through the real Envoy."""

from __future__ import annotations

import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mesh.conftest import MeshFactory
from tests.mesh.fakes import FakeReplica, echo


@pytest.fixture()
def socket_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ms-admin-", dir="/tmp"))  # short: a socket path holds at most 107 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_admin_on_a_unix_socket(make_mesh: MeshFactory, socket_dir: Path) -> None:
    replica = FakeReplica(echo).start()
    try:
        path = socket_dir / "run" / "admin.sock"  # the mesh makes the folder
        mesh = make_mesh([(replica.address, "v1")], admin=f"unix:{path}")  # start() waits for /ready over it
        mode = path.stat().st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert mesh.admin.ready()
        assert "outbound|grpc|v1|model" in mesh.admin.get("/clusters")
        assert mesh.admin.stat("server.live") == 1
    finally:
        replica.stop()
