"""The ingress's per-subject rate limit and its connection timeouts through the real Envoy, with the test-only
variants of istio/ (a budget of 3 calls per subject, 1-second timeouts)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.mesh import LocalMesh
from tests.mesh.conftest import ISTIO, MeshFactory
from tests.mesh.credentials import Issuer
from tests.mesh.fakes import INFER, FakeReplica, echo

TINY_BUDGET = ISTIO / "variants" / "ingress-ratelimit-tiny.yaml"
SHORT_TIMEOUTS = ISTIO / "variants" / "ingress-timeouts-short.yaml"
BUDGET = 3


@pytest.fixture()
def gateway() -> Iterator[FakeReplica]:
    fake = FakeReplica(echo).start()
    yield fake
    fake.stop()


def ingress(mesh: LocalMesh) -> str:
    assert mesh.ingress_address is not None
    return mesh.ingress_address


def infer(channel: grpc.Channel, metadata: list[tuple[str, str]]) -> tuple[grpc.StatusCode, str]:
    try:
        channel.unary_unary(INFER)(b"", metadata=metadata, timeout=5)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def test_each_subject_has_its_own_budget(make_mesh: MeshFactory, gateway: FakeReplica, issuer: Issuer) -> None:
    mesh = make_mesh([], gateway=gateway.address, jwks=issuer.topology_jwks, istio=[ISTIO, TINY_BUDGET])
    with grpc.insecure_channel(ingress(mesh)) as channel:
        alice = [infer(channel, [issuer.bearer("alice")]) for _ in range(BUDGET + 2)]
        bob = [infer(channel, [issuer.bearer("bob")]) for _ in range(BUDGET)]
        health = health_pb2_grpc.HealthStub(channel)
        for _ in range(BUDGET + 1):  # anonymous calls naming carol spend nothing of carol's budget
            reply = health.Check(health_pb2.HealthCheckRequest(), metadata=[("x-meshserve-subject", "carol")])
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        carol = [infer(channel, [issuer.bearer("carol"), ("x-meshserve-subject", "bob")]) for _ in range(BUDGET)]
    assert [code for code, _ in alice] == [grpc.StatusCode.OK] * BUDGET + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2
    assert "over this caller's limit" in alice[-1][1]
    assert [code for code, _ in bob] == [grpc.StatusCode.OK] * BUDGET  # alice's refusals cost bob nothing
    assert [code for code, _ in carol] == [grpc.StatusCode.OK] * BUDGET
    assert len([m for m, _ in gateway.calls if m == INFER]) == 3 * BUDGET  # refused calls never reach the gateway
    assert mesh.admin.stat("ingress_per_subject.http_local_rate_limit.rate_limited") == 2


def test_an_idle_connection_is_closed(make_mesh: MeshFactory, gateway: FakeReplica, issuer: Issuer) -> None:
    mesh = make_mesh([], gateway=gateway.address, jwks=issuer.topology_jwks, istio=[ISTIO, SHORT_TIMEOUTS])
    host, _, port = ingress(mesh).rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as silent:
        started = time.monotonic()
        assert silent.recv(1024) == b""  # closed by Envoy, not by the 5 s timeout of this socket
        assert time.monotonic() - started < 3
    with grpc.insecure_channel(ingress(mesh)) as channel:  # after a call, an HTTP/2 connection left idle
        assert infer(channel, [issuer.bearer("alice")])[0] == grpc.StatusCode.OK
        deadline = time.monotonic() + 5
        while mesh.admin.stat("http.ingress.downstream_cx_idle_timeout") < 2:
            assert time.monotonic() < deadline, "the idle HTTP/2 connection was not closed"
            time.sleep(0.1)
        assert infer(channel, [issuer.bearer("alice")])[0] == grpc.StatusCode.OK  # the client reconnects


def test_a_headers_only_stream_is_reset(make_mesh: MeshFactory, gateway: FakeReplica, issuer: Issuer) -> None:
    mesh = make_mesh([], gateway=gateway.address, jwks=issuer.topology_jwks, istio=[ISTIO, SHORT_TIMEOUTS])
    release = threading.Event()

    def nothing() -> Iterator[bytes]:  # the call's headers go out, its message never does
        release.wait(15)
        yield from ()

    with grpc.insecure_channel(ingress(mesh)) as channel:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as failed:
            channel.stream_unary(INFER)(nothing(), metadata=[issuer.bearer("alice")], timeout=10)
        elapsed = time.monotonic() - started
        release.set()
    assert elapsed < 4, (failed.value, elapsed)  # the ingress's 1 s, not this call's own 10 s deadline
    assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, failed.value  # not UNKNOWN "stream timeout"
    assert failed.value.details() == (
        "meshserve ingress: nothing sent or received on this call for 1 s (the ingress's stream idle timeout)"
    )
    assert mesh.admin.stat("http.ingress.downstream_rq_idle_timeout") == 1


def test_headers_that_never_end_are_refused(make_mesh: MeshFactory, gateway: FakeReplica, issuer: Issuer) -> None:
    mesh = make_mesh([], gateway=gateway.address, jwks=issuer.topology_jwks, istio=[ISTIO, SHORT_TIMEOUTS])
    host, _, port = ingress(mesh).rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as slow:
        slow.sendall(b"POST /inference.GRPCInferenceService/ModelInfer HTTP/1.1\r\nhost: x\r\n")  # and no more
        started = time.monotonic()
        answer = b""
        while chunk := slow.recv(4096):
            answer += chunk
        assert time.monotonic() - started < 3
    assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
    assert mesh.admin.stat("http.ingress.downstream_rq_header_timeout") == 1
