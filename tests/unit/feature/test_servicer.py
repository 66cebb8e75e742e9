"""The feature service as `python -m services.feature` wires it (build), served in this process on a Redis URL
that refuses connections: GetFeatureSet answers, Compute degrades instead of failing, Ingest is UNAVAILABLE,
and liveness / readiness follow the server's lifecycle."""

from __future__ import annotations

import logging

import grpc
import numpy as np
import pytest

from services.feature import metrics
from services.feature.__main__ import build
from services.feature.api import to_row
from services.feature.settings import FeatureSettings
from services.protos import feature_pb2 as pb
from services.protos import feature_pb2_grpc as pb_grpc
from tests.helpers.fixtures import fraud_row


def counter(metric: object, *labels: str) -> float:
    return float(metric.labels(*labels)._value.get())  # type: ignore[attr-defined]


async def test_served_without_redis(refused_url: str, caplog: pytest.LogCaptureFixture) -> None:
    url = refused_url.replace("//", "//:hunter2@")  # a password, which the log must not show
    settings = FeatureSettings(host="127.0.0.1", port=0, metrics_port=0, lookup_budget_ms=1000.0, redis_url=url)
    service, handler = build(settings)
    assert handler.lifecycle is service.lifecycle
    assert handler.live() and not handler.ready()  # not ready until SERVING
    await service.start()
    try:
        with caplog.at_level(logging.WARNING, "services.feature"):
            await handler.start()  # a store that does not answer is a warning, not a failure
        assert "does not answer; aggregates take their defaults" in caplog.text and "hunter2" not in caplog.text
        await service.set_serving(True)
        assert handler.live() and handler.ready()
        rows_before = counter(metrics.ROWS, "fraud_v1")
        degraded_before = counter(metrics.DEGRADED_ROWS, "fraud_v1")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
            stub = pb_grpc.FeatureServiceStub(channel)
            info = await stub.GetFeatureSet(pb.GetFeatureSetRequest(feature_set="fraud_v1"), timeout=5)
            assert len(info.features) == 64
            names = [f.name for f in info.features]
            rows = [to_row(fraud_row()), to_row(fraud_row(amount=0.0))]
            reply = await stub.Compute(pb.ComputeRequest(feature_set="fraud_v1", rows=rows), timeout=5)
            matrix = np.frombuffer(reply.features, dtype="<f4").reshape(reply.rows, reply.columns)
            assert [(f.defaulted, f.degraded) for f in reply.flags] == [(True, True)] * 2
            assert matrix[:, names.index("amount_log")].tolist() == pytest.approx([np.log1p(120.5), 0.0])
            assert matrix[0, names.index("user_count_24h")] == 0  # the declared default
            events = [to_row(fraud_row())]
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Ingest(pb.IngestRequest(feature_set="fraud_v1", events=events), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Compute(pb.ComputeRequest(feature_set="nope", rows=rows), timeout=5)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert counter(metrics.ROWS, "fraud_v1") == rows_before + 2
        assert counter(metrics.DEGRADED_ROWS, "fraud_v1") == degraded_before + 2
        service.request_stop()  # SIGTERM: readiness and liveness drop at once
        assert not handler.ready() and not handler.live()
    finally:
        await service.server.stop(0)
        await handler.close()
