"""The ingress under overload through the real Envoy: a gateway's shed reaches the client unretried with its
pushback, and past the gateway service's bound on requests in flight Envoy refuses at once, with a pushback too."""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from services.mesh import LocalMesh
from services.mesh.loader import load_istio
from tests.mesh.conftest import ISTIO, ROOT, MeshFactory
from tests.mesh.credentials import Issuer
from tests.mesh.fakes import INFER, PUSHBACK_MS, FakeReplica, Hold, echo, shed, unavailable

GATEWAY = "outbound|grpc||gateway"
INGRESS_PUSHBACK_MS = "50"


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


def in_flight_bound() -> int:
    (gateway,) = [dr for dr in load_istio([ISTIO]).destination_rules if dr.spec.host == "gateway"]
    assert gateway.spec.traffic_policy is not None and gateway.spec.traffic_policy.connection_pool is not None
    http = gateway.spec.traffic_policy.connection_pool.http
    assert http is not None and http.http2_max_requests is not None
    return http.http2_max_requests


def test_past_the_in_flight_bound_the_ingress_refuses_at_once_with_pushback(
    make_mesh: MeshFactory, fakes: list[FakeReplica], issuer: Issuer
) -> None:
    bound = in_flight_bound()
    hold = Hold()
    slow = start(fakes, FakeReplica(hold, workers=bound + 4))  # health checks still answered while calls are held
    # istio/ as shipped: its adaptive limit is off (on, it would refuse first: tests/mesh/test_ingress_adaptive.py),
    # so this is the outer bound on its own
    mesh = make_mesh([], gateway=slow.address, jwks=issuer.topology_jwks)
    metadata = [issuer.bearer("alice")]
    with grpc.insecure_channel(ingress(mesh)) as channel:
        call = channel.unary_unary(INFER)
        try:
            held = [call.future(b"", metadata=metadata, timeout=20) for _ in range(bound)]
            deadline = time.monotonic() + 10
            while mesh.admin.stat(f"cluster.{GATEWAY}.upstream_rq_active") < bound:
                assert time.monotonic() < deadline, mesh.admin.stats(re.escape(f"cluster.{GATEWAY}.upstream_rq"))
                time.sleep(0.02)
            refused = [refusal(call, metadata) for _ in range(5)]
        finally:
            hold.release()
        assert all(f.exception(timeout=10) is None for f in held)  # the held calls finish
        for error, _ in refused:
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
            assert trailers(error)["grpc-retry-pushback-ms"] == INGRESS_PUSHBACK_MS
            assert error.details() == (
                f"meshserve ingress: the ingress has {bound} requests in flight to the gateway; "
                f"retry after {INGRESS_PUSHBACK_MS} ms"
            )
        elapsed = [ms for _, ms in refused]
        assert statistics.median(elapsed) < 5 and max(elapsed) < 50, elapsed  # at once, never queued
        assert tries(slow) == bound  # the excess never reached the gateway
        assert mesh.admin.stat(f"cluster.{GATEWAY}.upstream_rq_active_overflow") == len(refused)
        call(b"", metadata=metadata, timeout=5)  # room again: calls pass
    assert tries(slow) == bound + 1


HOLDING_SERVER = """
import sys, threading, grpc
from concurrent.futures import ThreadPoolExecutor
from tests.mesh.fakes import FakeReplica, Hold
fake = FakeReplica(Hold(), workers=16).start()
print(fake.address, flush=True)
threading.Event().wait()
"""


def test_calls_on_a_gateway_killed_under_them_are_retried_on_another(
    make_mesh: MeshFactory, fakes: list[FakeReplica], issuer: Issuer
) -> None:
    """A gateway replica SIGKILLed with calls in flight: its connection is reset under them, before any answer, and
    the ingress retries them on the other replica (retryOn reset), so the callers never see the death."""
    doomed = subprocess.Popen(
        [sys.executable, "-c", HOLDING_SERVER], cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert doomed.stdout is not None
        doomed_address = doomed.stdout.readline().strip()
        live = start(fakes, FakeReplica(echo))
        mesh = make_mesh([], gateway=[doomed_address, live.address], jwks=issuer.topology_jwks, health_check=None)
        with grpc.insecure_channel(ingress(mesh)) as channel, ThreadPoolExecutor(8) as pool:
            call = channel.unary_unary(INFER)
            futures = [pool.submit(call, b"", metadata=[issuer.bearer("alice")], timeout=10) for _ in range(8)]
            time.sleep(1.0)  # the live replica answers its share at once; least-request balancing holds the rest
            held = 8 - sum(f.done() for f in futures)
            assert held >= 1, [f.exception() or f.result() for f in futures if f.done()]
            os.kill(doomed.pid, signal.SIGKILL)
            assert [f.result() for f in futures] == [b""] * 8  # every call answered, the held ones by a retry
        assert mesh.admin.stat(f"cluster.{GATEWAY}.upstream_rq_retry") >= held
    finally:
        doomed.kill()
        doomed.wait()
