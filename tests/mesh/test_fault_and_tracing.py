"""The fault-injection variant's abort and delay rates, and W3C trace context carried through Envoy."""

from __future__ import annotations

import secrets
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from tests.helpers.servers import ServiceProcess
from tests.mesh.conftest import ISTIO, MeshFactory, client_of, infer, subset_replicas
from tests.mesh.fakes import INFER, FakeReplica, echo

N = 400


def test_fault_variant_aborts_and_delays_at_its_rates(
    replicas: dict[str, list[ServiceProcess]], make_mesh: MeshFactory
) -> None:
    mesh = make_mesh(subset_replicas(replicas), istio=[ISTIO, ISTIO / "variants" / "model-fault.yaml"])

    def call(client: triton.InferenceServerClient) -> tuple[str, float]:
        start = time.perf_counter()
        try:
            outcome = infer(client)
        except InferenceServerException as exc:
            outcome = str(exc.status())
        return outcome, time.perf_counter() - start

    # Counted as differences: calls made while the mesh was being readied may have been delayed too.
    delays_before = mesh.admin.stat("http.model.fault.delays_injected")
    aborts_before = mesh.admin.stat("http.model.fault.aborts_injected")
    with client_of(mesh.address("model")) as client, ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: call(client), range(N)))
    aborted = sum(1 for outcome, _ in results if outcome == "StatusCode.UNAVAILABLE")
    assert {outcome for outcome, _ in results} <= {"1", "StatusCode.UNAVAILABLE"}  # the variant routes to v1 only
    assert abs(100 * aborted / N - 10) <= 5, aborted  # abort 10% (never retried: the filter runs before the router)
    delays = mesh.admin.stat("http.model.fault.delays_injected") - delays_before
    assert abs(100 * delays / N - 20) <= 7, delays  # delay 20%
    assert mesh.admin.stat("http.model.fault.aborts_injected") - aborts_before == aborted
    slow = sum(1 for _, seconds in results if seconds >= 0.049)
    assert abs(100 * slow / N - 20) <= 7, slow  # the client sees the 50 ms fixedDelay on about 20% of calls
    # ... and about as many as Envoy counted (a call or two of Envoy's count can differ from what the client saw)
    assert abs(slow - delays) <= 0.02 * N, (slow, delays)


@pytest.fixture()
def echo_replica() -> FakeReplica:
    fake = FakeReplica(echo).start()
    yield fake
    fake.stop()


def test_traceparent_reaches_the_replica_with_the_same_trace_id(
    make_mesh: MeshFactory, echo_replica: FakeReplica
) -> None:
    collector = FakeReplica(echo).start()  # OTLP/gRPC receiver: records Export calls
    try:
        mesh = make_mesh([(echo_replica.address, "v1"), (echo_replica.address, "v2")], otlp=collector.address)
        trace_id = secrets.token_hex(16)
        with grpc.insecure_channel(mesh.address("model")) as channel:
            call = channel.unary_unary(INFER)
            for _ in range(3):  # 3 calls x 2 spans reach the exporter's batch size (5): exported at once
                call(b"", metadata=[("traceparent", f"00-{trace_id}-{secrets.token_hex(8)}-01")], timeout=5)
            unsampled = secrets.token_hex(16)
            call(b"", metadata=[("traceparent", f"00-{unsampled}-{secrets.token_hex(8)}-00")], timeout=5)
        received = [md.get("traceparent", "").split("-") for method, md in echo_replica.calls if method == INFER]
        assert len(received) == 4
        assert all(tp[1] == trace_id and tp[3] == "01" for tp in received[:3]), received  # same trace, sampled
        assert received[3][1] == unsampled and received[3][3] == "00"  # the caller's "not sampled" is kept
        deadline = time.monotonic() + 8
        while not any("TraceService/Export" in method for method, _ in collector.calls):
            assert time.monotonic() < deadline, "no spans exported to the OTLP collector"
            time.sleep(0.1)
    finally:
        collector.stop()
