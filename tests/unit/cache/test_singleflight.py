"""Single-flight (what the gateway's runner coalesces concurrent misses with): concurrent calls of one key compute
once, errors are shared, and a cancelled caller does not cancel the computation for the others."""

from __future__ import annotations

import asyncio

from services.cache.singleflight import SingleFlight


async def test_single_flight_computes_once() -> None:
    flights: SingleFlight[bytes] = SingleFlight()
    calls = 0
    started, release = asyncio.Event(), asyncio.Event()

    async def compute() -> bytes:
        nonlocal calls
        calls += 1
        started.set()
        await release.wait()
        return b"computed"

    tasks = [asyncio.create_task(flights.do(b"same", compute)) for _ in range(50)]
    await started.wait()
    await asyncio.sleep(0.05)  # let every caller reach the in-flight computation
    assert b"same" in flights
    release.set()
    results = await asyncio.gather(*tasks)
    assert calls == 1 and results == [b"computed"] * 50
    assert len(flights) == 0
    assert await flights.do(b"same", compute) == b"computed" and calls == 2  # a later call computes afresh


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
