"""Two real Envoys, the edge tier's and the cloud tier's: the edge's egress (istio/edge) lets a general request out to
the cloud's TLS ingress after the emulated WAN delay, refuses a sensitive or unclassified one itself with
PERMISSION_DENIED (nothing reaches the cloud), and the cloud's ingress (istio/cloud) DENYs the sensitive class sent to
it directly, token or not."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest

from services.mesh import LocalMesh
from services.mesh.topology import Egress
from tests.helpers.servers import free_port
from tests.mesh.conftest import ISTIO, MeshFactory
from tests.mesh.credentials import Issuer, Pki
from tests.mesh.fakes import INFER, FakeReplica, echo

HEADER = "x-meshserve-data-class"
CLOUD_CLUSTER = "cluster.outbound|grpc||cloud.meshserve.example"
WAN_S = 0.030  # istio/edge/virtualservice.yaml's fixedDelay


@dataclass
class Tiers:
    edge: LocalMesh
    cloud: LocalMesh
    cloud_gateway: FakeReplica  # what answers behind the cloud's ingress; it records every call it gets

    @property
    def egress(self) -> str:
        assert self.edge.egress_address is not None
        return self.edge.egress_address

    @property
    def cloud_ingress(self) -> str:
        assert self.cloud.ingress_address is not None
        return self.cloud.ingress_address


@pytest.fixture()
def tiers(make_mesh: MeshFactory, issuer: Issuer, pki: Pki) -> Iterator[Tiers]:
    gateway = FakeReplica(echo).start()
    cloud = make_mesh(
        [],
        gateway=gateway.address,
        istio=[ISTIO, ISTIO / "cloud"],
        jwks=issuer.topology_jwks,
        ingress_tls=pki.ingress_tls,
    )
    assert cloud.ingress_address is not None
    egress = Egress(listen=f"127.0.0.1:{free_port()}", cloud_ingress=cloud.ingress_address, tls_ca=pki.ca_path)
    edge = make_mesh([], istio=[ISTIO, ISTIO / "edge"], egress=egress)
    yield Tiers(edge, cloud, gateway)
    gateway.stop()


def call(address: str, metadata: list[tuple[str, str]], pki: Pki | None = None) -> grpc.StatusCode:
    """One unary call; its status code (the fake gateway answers OK)."""
    return call_details(address, metadata, pki)[0]


def call_details(
    address: str, metadata: list[tuple[str, str]], pki: Pki | None = None
) -> tuple[grpc.StatusCode, str | None]:
    """One unary call; its status code and message."""
    channel = (
        grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=pki.ca_pem))
        if pki is not None
        else grpc.insecure_channel(address)
    )
    with channel:
        try:
            channel.unary_unary(INFER)(b"", metadata=metadata, timeout=5)
        except grpc.RpcError as exc:
            return exc.code(), exc.details()
    return grpc.StatusCode.OK, None


def test_general_requests_cross_after_the_wan_delay(tiers: Tiers, issuer: Issuer) -> None:
    token = issuer.bearer("edge-gateway")
    for _ in range(3):
        start = time.perf_counter()
        assert call(tiers.egress, [(HEADER, "general"), token]) == grpc.StatusCode.OK
        assert time.perf_counter() - start >= WAN_S
    assert [(m, md[HEADER]) for m, md in tiers.cloud_gateway.calls] == [(INFER, "general")] * 3
    assert tiers.edge.admin.stat("http.egress.fault.delays_injected") == 3
    assert tiers.edge.admin.stat(f"{CLOUD_CLUSTER}.upstream_rq_total") == 3
    assert tiers.cloud.admin.stat("http.ingress.downstream_rq_total") >= 3


def test_sensitive_and_unclassified_requests_are_refused_at_the_egress(tiers: Tiers, issuer: Issuer) -> None:
    token = issuer.bearer("edge-gateway")
    for metadata in ([(HEADER, "sensitive"), token], [token], [(HEADER, "public"), token]):
        code, message = call_details(tiers.egress, metadata)
        assert code == grpc.StatusCode.PERMISSION_DENIED, metadata
        assert message is not None and "may not leave this tier" in message
    assert tiers.edge.admin.stat("http.egress.fault.aborts_injected") == 3
    assert tiers.edge.admin.stat(f"{CLOUD_CLUSTER}.upstream_rq_total") == 0
    assert tiers.edge.admin.stat(f"{CLOUD_CLUSTER}.upstream_cx_total") == 0  # not even a connection to the cloud
    assert tiers.cloud.admin.stat("http.ingress.downstream_rq_total") == 0
    assert tiers.cloud_gateway.calls == []


def test_the_cloud_ingress_denies_the_sensitive_class_sent_to_it(tiers: Tiers, issuer: Issuer, pki: Pki) -> None:
    token = issuer.bearer("edge-gateway")
    assert call(tiers.cloud_ingress, [(HEADER, "sensitive"), token], pki) == grpc.StatusCode.PERMISSION_DENIED
    assert call(tiers.cloud_ingress, [(HEADER, "general"), token], pki) == grpc.StatusCode.OK
    assert (
        call(tiers.cloud_ingress, [token], pki) == grpc.StatusCode.OK
    )  # the cloud itself may serve unclassified calls
    assert [md.get(HEADER) for _, md in tiers.cloud_gateway.calls] == ["general", None]
    assert tiers.cloud.admin.stat("http.ingress.rbac.denied") >= 1
