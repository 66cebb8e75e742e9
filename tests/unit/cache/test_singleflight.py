"""Single-flight: concurrent misses of one key compute once (through the client too), errors are shared, and a
cancelled caller does not cancel the computation for the others."""

from __future__ import annotations

import asyncio

from services.cache.client import CacheClient
from services.cache.singleflight import SingleFlight
from services.common.server import GrpcService


async def test_single_flight_computes_once(cache_server: GrpcService) -> None:
    client = CacheClient(f"127.0.0.1:{cache_server.port}", timeout_s=5.0)
    calls = 0
    started, release = asyncio.Event(), asyncio.Event()

    async def compute() -> bytes:
        nonlocal calls
        calls += 1
        started.set()
        await release.wait()
        return b"computed"

    async def call() -> tuple[bytes, bool]:
        return await client.get_or_compute(b"same", compute, pipeline="p", model_name="m", model_version="1", ttl_s=60)

    try:
        tasks = [asyncio.create_task(call()) for _ in range(50)]
        await started.wait()
        await asyncio.sleep(0.05)  # let every caller reach the in-flight computation
        assert b"same" in client.flights
        release.set()
        results = await asyncio.gather(*tasks)
        assert calls == 1 and results == [(b"computed", False)] * 50
        assert await call() == (b"computed", True)  # stored after the computation
        assert calls == 1 and len(client.flights) == 0
    finally:
        await client.close()


async def test_single_flight_shares_errors_and_survives_a_cancelled_caller() -> None:
    flights: SingleFlight[int] = SingleFlight()
    gate = asyncio.Event()
    runs = 0

    async def boom() -> int:
        nonlocal runs
        runs += 1
        await gate.wait()
        raise ValueError("model failed")

    tasks = [asyncio.create_task(flights.do("k", boom)) for _ in range(10)]
    await asyncio.sleep(0.01)
    tasks[0].cancel()  # one caller gives up; the others still get the shared outcome
    gate.set()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert runs == 1 and isinstance(outcomes[0], asyncio.CancelledError)
    assert all(isinstance(o, ValueError) for o in outcomes[1:])

    async def ok() -> int:
        return 7

    assert await flights.do("k", ok) == 7 and len(flights) == 0
