"""OnlineStore on a Redis that refuses connections: it reports, raises FAILURES, and never waits long."""

from __future__ import annotations

import time

import numpy as np
import pytest

from services.feature.store import FAILURES, OnlineStore
from services.feature.store.client import COMMAND_TIMEOUT_S
from services.feature.store.scripts import INGEST_LUA, READ_LUA
from tests.unit.feature.specs import agg_plan


async def test_a_refusing_redis(refused_url: str) -> None:
    store = OnlineStore(refused_url, "p:", max_connections=4)
    try:
        pool = store.client.connection_pool
        assert pool.max_connections == 4
        assert pool.connection_kwargs["socket_timeout"] == COMMAND_TIMEOUT_S == 2.0
        assert (store.scripts.ingest.script, store.scripts.read.script) == (INGEST_LUA, READ_LUA)
        assert store.base(agg_plan()) == "p:agg_v1:"
        start = time.perf_counter()
        assert not await store.prepare()
        assert not await store.ping()
        plan = agg_plan()
        columns = {
            "ts": np.array([1_700_000_000], dtype=np.int64),
            "user": np.array(["u"], dtype=object),
            "merchant": np.array(["m"], dtype=object),
            "amount": np.array([1.0]),
        }
        with pytest.raises(FAILURES):
            await store.read(plan, columns, "ts", 1.0)
        assert store.round_trips == 1
        with pytest.raises(FAILURES):
            await store.ingest(plan, columns, "ts", 1.0)
        assert await store.ingest(plan, {k: v[:0] for k, v in columns.items()}, "ts", 1.0) == 0  # nothing to send
        assert time.perf_counter() - start < 2.0
    finally:
        await store.close()
