"""Fixtures for in-process scaler tests: settings, a handler, report streams a test feeds by hand, and the real
scaler (both gRPC services, as `python -m services.scaler` wires them) on a loopback port, all in this process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.scaler.__main__ import build
from services.scaler.domain import Demand, DemandSnapshot
from services.scaler.handler import ScalerHandler
from services.scaler.settings import ScalerSettings
from tests.helpers.inprocess import serving_built


def scaler_settings(**overrides: Any) -> ScalerSettings:
    """Test settings: loopback, a free port, no metrics port, no shutdown delay."""
    base: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "metrics_port": 0, "shutdown_delay_s": 0.0}
    return ScalerSettings(**{**base, **overrides})


def snapshot(gateway: str, **demand: tuple[int, int]) -> DemandSnapshot:
    """A gateway's snapshot from `model__subset=(in_flight, parked)` (`model=` alone: subset "")."""
    parsed = {}
    for key, (in_flight, parked) in demand.items():
        model, _, subset = key.partition("__")
        parsed[(model, subset)] = Demand(in_flight, parked)
    return DemandSnapshot(gateway, parsed)


class Feed:
    """A report stream a test writes into: `send` a snapshot, `end` the stream; `ack` is the handler's answer."""

    def __init__(self, handler: ScalerHandler) -> None:
        self._queue: asyncio.Queue[DemandSnapshot | None] = asyncio.Queue()
        self.task = asyncio.ensure_future(handler.report(self._stream()))

    async def _stream(self) -> AsyncIterator[DemandSnapshot]:
        while (item := await self._queue.get()) is not None:
            yield item

    async def send(self, item: DemandSnapshot) -> None:
        self._queue.put_nowait(item)
        for _ in range(5):  # let the handler take it
            await asyncio.sleep(0)

    async def end(self) -> None:
        self._queue.put_nowait(None)
        await asyncio.wait_for(asyncio.shield(self.task), 5)


@pytest.fixture()
async def handler() -> AsyncIterator[ScalerHandler]:
    made = ScalerHandler(scaler_settings())
    yield made
    await made.close()


@pytest.fixture()
async def scaler_server() -> AsyncIterator[Any]:
    """The real scaler service as `python -m services.scaler` wires it, on a loopback port, in this process; reports
    go stale after 0.5 s."""
    async with serving_built(*build(scaler_settings(stale_after_s=0.5))) as service:
        yield service
