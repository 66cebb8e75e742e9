"""The ingress listener (the Istio Gateway's stand-in) routes any host to the gateway service with the caller's
metadata, less the headers that steer calls inside the mesh; the mesh's own canary routing still follows them."""

from __future__ import annotations

import grpc

from tests.mesh.conftest import MeshFactory
from tests.mesh.credentials import Issuer
from tests.mesh.fakes import INFER, FakeReplica, echo

STEERING = [("x-canary", "true"), ("x-model-version", "2")]


def test_ingress_strips_steering_headers_that_the_mesh_still_honours(make_mesh: MeshFactory, issuer: Issuer) -> None:
    gateway, v1, v2 = (FakeReplica(echo).start() for _ in range(3))
    try:
        mesh = make_mesh([(v1.address, "v1"), (v2.address, "v2")], gateway=gateway.address, jwks=issuer.topology_jwks)
        assert mesh.ingress_address is not None
        with grpc.insecure_channel(mesh.ingress_address) as channel:
            channel.unary_unary(INFER)(b"", metadata=[issuer.bearer("alice"), *STEERING], timeout=5)
        with grpc.insecure_channel(mesh.address("gateway")) as channel:  # the gateway's own mesh listener
            channel.unary_unary(INFER)(b"", timeout=5)
        assert [method for method, _ in gateway.calls] == [INFER, INFER]
        outside = gateway.calls[0][1]
        assert "x-canary" not in outside and "x-model-version" not in outside  # a caller cannot pick the canary
        assert "x-request-id" in outside
        with grpc.insecure_channel(mesh.address("model")) as channel:  # the gateway's call to the model
            for _ in range(20):
                channel.unary_unary(INFER)(b"", metadata=[("x-canary", "true")], timeout=5)
        assert len(v2.calls) == 20 and not v1.calls  # inside the mesh x-canary still pins v2
    finally:
        for fake in (gateway, v1, v2):
            fake.stop()
