"""TLS at the ingress through the real Envoy: the Gateway's HTTPS server (tls SIMPLE) rendered with the topology's
certificate, reached by gRPC clients that trust the test's CA, refused to plaintext and to clients that do not."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import grpc
import pytest
import tritonclient.grpc as triton
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from services.mesh import LocalMesh
from tests.mesh.conftest import MeshFactory
from tests.mesh.credentials import Issuer, Pki, make_pki
from tests.mesh.fakes import INFER, FakeReplica, echo


@pytest.fixture()
def tls_mesh(make_mesh: MeshFactory, issuer: Issuer, pki: Pki) -> tuple[LocalMesh, FakeReplica]:
    gateway = FakeReplica(echo).start()
    mesh = make_mesh([], gateway=gateway.address, jwks=issuer.topology_jwks, ingress_tls=pki.ingress_tls)
    yield mesh, gateway
    gateway.stop()


def address(mesh: LocalMesh) -> str:
    assert mesh.ingress_address is not None
    return mesh.ingress_address


def test_grpc_over_tls_with_a_token(tls_mesh: tuple[LocalMesh, FakeReplica], issuer: Issuer, pki: Pki) -> None:
    mesh, gateway = tls_mesh
    credentials = grpc.ssl_channel_credentials(root_certificates=pki.ca_pem)
    with grpc.secure_channel(address(mesh), credentials) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        channel.unary_unary(INFER)(b"", metadata=[issuer.bearer("alice")], timeout=5)
        with pytest.raises(grpc.RpcError) as refused:
            channel.unary_unary(INFER)(b"", timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert [method for method, _ in gateway.calls] == [INFER]


def test_tritonclient_over_tls(tls_mesh: tuple[LocalMesh, FakeReplica], issuer: Issuer, pki: Pki) -> None:
    mesh, gateway = tls_mesh
    client = triton.InferenceServerClient(url=address(mesh), ssl=True, root_certificates=str(pki.ca_path))
    try:
        with pytest.raises(InferenceServerException) as refused:
            client.is_server_live(client_timeout=5)
        assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
        name, value = issuer.bearer("alice")
        client.is_server_live(headers={name: value}, client_timeout=5)  # the fake gateway answers live=false
    finally:
        client.close()
    assert [method for method, _ in gateway.calls] == ["/inference.GRPCInferenceService/ServerLive"]


def test_plaintext_and_untrusted_clients_are_refused(
    tls_mesh: tuple[LocalMesh, FakeReplica], issuer: Issuer, tmp_path: Path
) -> None:
    mesh, gateway = tls_mesh
    other_ca = make_pki(tmp_path / "other").ca_pem
    for channel in (
        grpc.insecure_channel(address(mesh)),
        grpc.secure_channel(address(mesh), grpc.ssl_channel_credentials(root_certificates=other_ca)),
    ):
        with channel, pytest.raises(grpc.RpcError) as refused:
            channel.unary_unary(INFER)(b"", metadata=[issuer.bearer("alice")], timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert gateway.calls == []


def test_tls_offers_h2(tls_mesh: tuple[LocalMesh, FakeReplica], pki: Pki) -> None:
    mesh, _ = tls_mesh
    host, _, port = address(mesh).rpartition(":")
    context = ssl.create_default_context(cadata=pki.ca_pem.decode())
    context.set_alpn_protocols(["h2"])
    context.maximum_version = ssl.TLSVersion.TLSv1_2  # the oldest version the ingress accepts (as Istio's gateways)
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname=host) as tls:
            assert tls.selected_alpn_protocol() == "h2" and tls.version() == "TLSv1.2"
