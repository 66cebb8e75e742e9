"""The ingress under overload through the real Envoy: a gateway's shed reaches the client unretried with its
pushback, while a dead gateway replica is still retried on another."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from services.mesh import LocalMesh
from tests.mesh.conftest import MeshFactory
from tests.mesh.credentials import Issuer
from tests.mesh.fakes import INFER, PUSHBACK_MS, FakeReplica, echo, shed, unavailable

GATEWAY = "outbound|grpc||gateway"


@pytest.fixture()
def fakes() -> Iterator[list[FakeReplica]]:
    started: list[FakeReplica] = []
    yield started
    for fake in started:
        fake.stop()


def start(fakes: list[FakeReplica], fake: FakeReplica) -> FakeReplica:
    fakes.append(fake.start())
    return fake


def ingress(mesh: LocalMesh) -> str:
    assert mesh.ingress_address is not None
    return mesh.ingress_address


def refusal(call: grpc.UnaryUnaryMultiCallable, metadata: list[tuple[str, str]]) -> tuple[grpc.RpcError, float]:
    """The error of one call that must fail, and how long it took (ms)."""
    started = time.perf_counter()
    with pytest.raises(grpc.RpcError) as failed:
        call(b"", metadata=metadata, timeout=5)
    return failed.value, (time.perf_counter() - started) * 1000


def trailers(error: grpc.RpcError) -> dict[str, str]:
    return {key: value for key, value in error.trailing_metadata() or ()}


def tries(fake: FakeReplica) -> int:
    return sum(1 for method, _ in fake.calls if method == INFER)


def test_a_gateways_shed_reaches_the_client_unretried(
    make_mesh: MeshFactory, fakes: list[FakeReplica], issuer: Issuer
) -> None:
    busy = start(fakes, FakeReplica(shed))
    mesh = make_mesh([], gateway=busy.address, jwks=issuer.topology_jwks)
    with grpc.insecure_channel(ingress(mesh)) as channel:
        error, _ = refusal(channel.unary_unary(INFER), [issuer.bearer("alice")])
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert trailers(error)["grpc-retry-pushback-ms"] == PUSHBACK_MS  # the gateway's own hint, untouched
    assert tries(busy) == 1
    assert mesh.admin.stat(f"cluster.{GATEWAY}.upstream_rq_retry") == 0


def test_a_dead_gateway_replica_is_still_retried_on_another(
    make_mesh: MeshFactory, fakes: list[FakeReplica], issuer: Issuer
) -> None:
    dead = start(fakes, FakeReplica(unavailable))
    mesh = make_mesh([], gateway=dead.address, jwks=issuer.topology_jwks, health_check=None)
    with grpc.insecure_channel(ingress(mesh)) as channel:
        error, _ = refusal(channel.unary_unary(INFER), [issuer.bearer("alice")])
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert tries(dead) == 3  # `attempts: 2` retries
    live = start(fakes, FakeReplica(echo))
    mesh = make_mesh([], gateway=[dead.address, live.address], jwks=issuer.topology_jwks, health_check=None)
    with grpc.insecure_channel(ingress(mesh)) as channel:
        for _ in range(4):  # fewer than outlier detection's 5 consecutive errors: both replicas stay in rotation
            channel.unary_unary(INFER)(b"", metadata=[issuer.bearer("alice")], timeout=5)
    assert tries(live) == 4
