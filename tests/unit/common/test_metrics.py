"""Per-RPC metrics: counts by method and code, unary handling time apart from stream lifetimes, exemplars that
link to the sampled trace, and the /metrics endpoint."""

from __future__ import annotations

import urllib.request

import grpc
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import REGISTRY

from services.common.metrics import LATENCY_BUCKETS, STREAM_BUCKETS, RpcMetrics, start_metrics_server, trace_exemplar
from tests.helpers.servers import free_port

SERVICE = "metricstest"


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"service": SERVICE, **labels}) or 0.0


def test_unary_and_stream_observations_go_to_their_own_histograms() -> None:
    metrics = RpcMetrics(SERVICE)
    metrics.observe("Lookup", grpc.StatusCode.OK, 0.002)
    metrics.observe("Lookup", grpc.StatusCode.OK, 0.004)
    metrics.observe("Lookup", grpc.StatusCode.UNAVAILABLE, 0.001)
    metrics.observe_stream("Watch", grpc.StatusCode.CANCELLED, 3600.0)
    assert sample("meshserve_grpc_server_handled_total", method="Lookup", code="OK") == 2
    assert sample("meshserve_grpc_server_handled_total", method="Lookup", code="UNAVAILABLE") == 1
    assert sample("meshserve_grpc_server_handled_total", method="Watch", code="CANCELLED") == 1
    assert sample("meshserve_grpc_server_handling_seconds_count", method="Lookup") == 3
    assert sample("meshserve_grpc_server_handling_seconds_sum", method="Lookup") == 0.007
    assert sample("meshserve_grpc_server_handling_seconds_bucket", method="Lookup", le="0.002") == 2
    # An hour-long stream is not an hour-long RPC for the latency SLO.
    assert sample("meshserve_grpc_server_handling_seconds_count", method="Watch") == 0
    assert sample("meshserve_grpc_server_stream_seconds_count", method="Watch") == 1
    assert sample("meshserve_grpc_server_stream_seconds_bucket", method="Watch", le="3600.0") == 1
    assert sample("meshserve_grpc_server_stream_seconds_bucket", method="Watch", le="900.0") == 0


def test_buckets() -> None:
    assert LATENCY_BUCKETS[0] == 0.0001 and LATENCY_BUCKETS[-1] == 10.0 and 0.00075 in LATENCY_BUCKETS
    assert list(LATENCY_BUCKETS) == sorted(LATENCY_BUCKETS) and list(STREAM_BUCKETS) == sorted(STREAM_BUCKETS)
    assert STREAM_BUCKETS[-1] == 24 * 3600


def test_an_exemplar_only_under_a_sampled_span() -> None:
    assert trace_exemplar() is None
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("rpc") as span:
        assert trace_exemplar() == {"trace_id": format(span.get_span_context().trace_id, "032x")}


def test_the_metrics_endpoint() -> None:
    assert start_metrics_server(0) is None  # disabled
    RpcMetrics(SERVICE).observe("Ping", grpc.StatusCode.OK, 0.001)
    port = start_metrics_server(free_port(), "127.0.0.1")
    assert port is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    assert f'meshserve_grpc_server_handled_total{{code="OK",method="Ping",service="{SERVICE}"}} 1.0' in text
