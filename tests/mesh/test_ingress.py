"""The ingress listener (the Istio Gateway's stand-in) routes any host to the gateway service, metadata intact."""

from __future__ import annotations

import grpc

from tests.mesh.conftest import MeshFactory
from tests.mesh.fakes import INFER, FakeReplica, echo


def test_ingress_reaches_the_gateway_with_client_metadata(make_mesh: MeshFactory) -> None:
    gateway = FakeReplica(echo).start()
    try:
        mesh = make_mesh([], gateway=gateway.address)
        assert mesh.ingress_address is not None
        with grpc.insecure_channel(mesh.ingress_address) as channel:
            channel.unary_unary(INFER)(b"", metadata=[("x-canary", "true")], timeout=5)
        with grpc.insecure_channel(mesh.address("gateway")) as channel:  # the gateway's own mesh listener
            channel.unary_unary(INFER)(b"", timeout=5)
        assert [method for method, _ in gateway.calls] == [INFER, INFER]
        assert gateway.calls[0][1]["x-canary"] == "true"  # the gateway sees the header to pass on to the model
        assert "x-request-id" in gateway.calls[0][1]
    finally:
        gateway.stop()
