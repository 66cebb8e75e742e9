"""The real local stack (`meshserve up`, secure and --insecure) answers through its ingress while none of its gRPC
services, nor the mesh's listeners they call each other through, listens on a TCP port: each is an owner-only Unix
socket in the stack's state dir. The listening sockets are walked from /proc, per process."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cli_stack import FRAUD_ROW, NEEDS_STACK, Stack, local_stack, meshserve
from tests.helpers.sockets import walk_listening_sockets

pytestmark = NEEDS_STACK

ROW = FRAUD_ROW
GRPC_SERVICES = ("gateway", "model", "feature", "cache", "scaler")  # process names start with one of these


@pytest.fixture(scope="module", params=[(), ("--insecure",)], ids=["secure", "insecure"])
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with local_stack(tmp_path_factory.mktemp("sock") / "logs", args=request.param) as s:
        yield s


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_stack_answers_through_its_ingress(stack: Stack) -> None:
    done = meshserve("infer", "fraud", "--json", json.dumps(ROW), "--log-dir", str(stack.log_dir), timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "outputs" in json.loads(done.stdout)
    status = meshserve("status", "--log-dir", str(stack.log_dir))
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.count("SERVING") >= 7  # every gRPC service, probed on its socket, and the ingress


def test_no_grpc_service_and_no_mesh_listener_is_a_tcp_port(stack: Stack) -> None:
    state = stack.state()
    sockets = Path(state["sockets"])
    assert sockets == stack.log_dir.resolve() / "sockets" and mode(sockets) == 0o700
    ingress_port = int(state["ingress"].rpartition(":")[2])
    checked = 0
    for service in state["services"]:
        name, pid = service["name"], service["pid"]
        listening = walk_listening_sockets([pid])
        if name.startswith(GRPC_SERVICES):
            assert service["address"] == f"unix:{sockets}/{name}.sock"
            assert mode(sockets / f"{name}.sock") == 0o600
            # its /metrics is its only port (closed by the stack's internal credential, not by a socket)
            assert listening == [("127.0.0.1", service["metrics_port"])], name
            checked += 1
        elif name == "envoy":
            assert listening == [("127.0.0.1", ingress_port)]  # the ingress alone; the admin is a socket too
    assert checked >= 6  # gateway, three model replicas, feature, cache
    for service in ("gateway", "model", "feature", "cache"):
        assert mode(sockets / f"mesh-{service}.sock") == 0o600
    assert sorted(p.name for p in sockets.iterdir() if not p.is_socket()) == []
