"""The FeatureService over real gRPC sockets: Compute / Ingest / GetFeatureSet, status codes, the process."""

from __future__ import annotations

import math
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest

from services.common.server import GrpcService
from services.feature.api import to_row
from services.protos import feature_pb2 as pb
from services.protos import feature_pb2_grpc as pb_grpc
from tests.helpers.fixtures import T0, fraud_row
from tests.helpers.servers import feature_service


def target(service: GrpcService) -> str:
    return f"127.0.0.1:{service.port}"


async def test_compute_ingest_and_metadata_over_grpc(feature_server: GrpcService) -> None:
    async with grpc.aio.insecure_channel(target(feature_server)) as channel:
        stub = pb_grpc.FeatureServiceStub(channel)
        info = await stub.GetFeatureSet(pb.GetFeatureSetRequest(feature_set="fraud_v1"), timeout=5)
        assert (info.name, info.version, info.timestamp_field) == ("fraud", 1, "event_time")
        assert len(info.features) == 64 and {f.dtype for f in info.features} == {"FP32"}
        assert {i.name: i.type for i in info.inputs}["event_time"] == "int64"

        events = [to_row(fraud_row(event_time=T0 - 16000 - 600 * i, amount=10.0 * i)) for i in range(1, 6)]
        ingested = await stub.Ingest(pb.IngestRequest(feature_set="fraud_v1", events=events), timeout=5)
        assert ingested.ingested == 5

        rows = [to_row(fraud_row()), to_row(fraud_row(user_id="new"))]
        reply = await stub.Compute(pb.ComputeRequest(feature_set="fraud_v1", rows=rows), timeout=5)
        assert (reply.feature_set, reply.rows, reply.columns) == ("fraud_v1", 2, 64)
        assert list(reply.feature_names) == [f.name for f in info.features]
        matrix = np.frombuffer(reply.features, dtype="<f4").reshape(reply.rows, reply.columns)
        names = list(reply.feature_names)
        # before T0's 6 h bucket (it starts at T0 - 15200), so every window of every entity has data
        assert matrix[0, names.index("user_count_24h")] == pytest.approx(math.log1p(5))
        assert matrix[0, names.index("user_max_amount_24h")] == pytest.approx(50.0)
        assert matrix[1, names.index("user_count_24h")] == 0
        assert [(f.defaulted, f.degraded) for f in reply.flags] == [(False, False), (True, False)]


async def test_bad_requests_map_to_status_codes(feature_server: GrpcService) -> None:
    good = to_row(fraud_row())
    mistyped = to_row(fraud_row(amount="lots"))
    empty_value = pb.Row(fields={**good.fields, "amount": pb.Value()})
    bad = [
        (
            "Compute",
            pb.ComputeRequest(feature_set="fraud_v1", rows=[good, mistyped]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "row 1: field 'amount' must be double, got string",
        ),
        (
            "Compute",
            pb.ComputeRequest(feature_set="fraud_v1", rows=[empty_value]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "row 0: field 'amount' (double) has no value",
        ),
        (
            "Compute",
            pb.ComputeRequest(feature_set="fraud_v1", rows=[good] * 1025),
            grpc.StatusCode.INVALID_ARGUMENT,
            "1025 rows",
        ),
        ("Compute", pb.ComputeRequest(feature_set="fraud_v7", rows=[good]), grpc.StatusCode.NOT_FOUND, "fraud_v7"),
        ("GetFeatureSet", pb.GetFeatureSetRequest(feature_set="x"), grpc.StatusCode.NOT_FOUND, "'x'"),
        ("Ingest", pb.IngestRequest(feature_set="fraud_v1"), grpc.StatusCode.INVALID_ARGUMENT, "no events"),
    ]
    async with grpc.aio.insecure_channel(target(feature_server)) as channel:
        stub = pb_grpc.FeatureServiceStub(channel)
        for method, request, code, says in bad:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await getattr(stub, method)(request, timeout=5)
            assert err.value.code() == code, (method, err.value.details())
            assert says in (err.value.details() or ""), err.value.details()


def test_process_with_embedded_valkey(tmp_path: Path) -> None:
    """`python -m services.feature` with MESHSERVE_REDIS_URL unset: embedded Valkey, health, metrics, SIGTERM."""
    with feature_service(tmp_path) as service:
        with grpc.insecure_channel(service.address) as channel:
            stub = pb_grpc.FeatureServiceStub(channel)
            events = [to_row(fraud_row(event_time=T0 - 5000))]
            assert stub.Ingest(pb.IngestRequest(feature_set="fraud_v1", events=events), timeout=5).ingested == 1
            rows = [to_row(fraud_row()) for _ in range(3)]
            reply = stub.Compute(pb.ComputeRequest(feature_set="fraud_v1", rows=rows), timeout=5)
            assert reply.rows == 3 and not any(f.degraded for f in reply.flags)
        url = f"http://127.0.0.1:{service.metrics_port}/metrics"
        body = urllib.request.urlopen(url, timeout=5).read().decode()
        assert 'meshserve_feature_rows_total{feature_set="fraud_v1"} 3.0' in body
        assert 'meshserve_feature_redis_round_trips_sum{feature_set="fraud_v1"} 1.0' in body
        assert "meshserve_feature_compute_seconds_bucket" in body
        assert service.terminate() == 0, service.log()
    assert "embedded valkey" in service.log()
