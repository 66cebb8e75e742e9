"""The online store's Redis client: OnlineStore reads and writes the aggregates of feature sets in one Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np
from redis.exceptions import NoScriptError, RedisError

from services.common.redis import connect
from services.feature.store.decode import AggregateResult, decode
from services.feature.store.layout import key_base
from services.feature.store.plan import AggregatePlan
from services.feature.store.scripts import INGEST_LUA, READ_LUA, Scripts, id_table, ingest_args, read_args

FAILURES = (RedisError, OSError, TimeoutError)  # what a store call raises when Redis is down, slow or refusing
# One command or script may take this long: an ingest of a full batch (max_batch events through one ingest.lua
# call) runs far longer than a cache GET, so the feature service allows more than the cache does. Compute is
# bounded by its own (shorter) budget.
COMMAND_TIMEOUT_S = 2.0
PREPARE_TIMEOUT_S = 2.0
PING_TIMEOUT_S = 1.0


class IngestRefused(Exception):
    """ingest.lua refused a request whole (nothing written): an event would bring a bucket's sum past its cap."""

    def __init__(self, event: int, field: str, total: str, cap: str) -> None:
        super().__init__(f"event {event}: field {field!r}: a bucket's sum would be {total} (at most {cap})")
        self.event, self.field, self.total, self.cap = event, field, total, cap


class OnlineStore:
    """Reads and writes the aggregates of feature sets in one Redis (or Valkey)."""

    def __init__(self, url: str, prefix: str, max_connections: int = 64) -> None:
        self.prefix = prefix
        self.client = connect(url, max_connections=max_connections, command_timeout_s=COMMAND_TIMEOUT_S)
        self.scripts = Scripts.register(self.client)
        self.round_trips = 0  # requests sent by `read` (one per Compute that has aggregates)

    def base(self, plan: AggregatePlan) -> str:
        """What every key of the plan's feature set starts with."""
        return key_base(self.prefix, plan.set_id)

    # -- ingest -----------------------------------------------------------------------------------

    async def ingest(
        self, plan: AggregatePlan, columns: Mapping[str, np.ndarray], ts_field: str, timeout_s: float
    ) -> int:
        """Apply a batch of events (validated columns) atomically, in one round trip: one ingest.lua call.

        The script updates bucket records, HyperLogLogs, last-seen sets, pruning and TTLs. It checks every event
        before it writes any, so a batch is applied whole or not at all: IngestRefused when an event would bring
        a bucket's sum past what its aggregates can hold (AggregatePlan.sum_cap).
        """
        rows = len(columns[ts_field])
        if not rows or not plan.aggregates:
            return rows
        events = ingest_args(plan, columns, ts_field)
        ingest_plan = plan.ingest_plan(self.base(plan))
        async with asyncio.timeout(timeout_s):
            try:
                reply = await self.client.evalsha(self.scripts.ingest.sha, 0, ingest_plan, events)
            except NoScriptError:  # a restarted or different server (nothing was applied): load it and retry once
                self.scripts.ingest.sha = await self.client.script_load(INGEST_LUA)
                reply = await self.client.evalsha(self.scripts.ingest.sha, 0, ingest_plan, events)
        if isinstance(reply, list):
            event, field, total, cap = reply
            raise IngestRefused(int(event), _text(field), _text(total), _text(cap))
        return rows

    # -- read -------------------------------------------------------------------------------------

    async def read(
        self,
        plan: AggregatePlan,
        columns: Mapping[str, np.ndarray],
        ts_field: str,
        budget_s: float,
        sent: asyncio.Future[None] | None = None,
    ) -> AggregateResult:
        """Every aggregate of every row as of the row's event time, in one pipelined round trip.

        read.lua walks the rows inside Redis (one ZRANGEBYSCORE of bucket records per pair of bucket groups,
        PFCOUNT over the HyperLogLogs of the window's blocks and left-over buckets, ZREVRANGEBYSCORE for the last
        event before t) and returns the bucket records of all its rows as one binary string per pair of groups
        (windowed by the decoder in numpy) and one integer per row and distinct / since_last aggregate. One
        script call per READ_CHUNK_ROWS rows, all sent at once (one command, or one pipeline).
        Raises FAILURES (or TimeoutError past the budget): the caller degrades.

        `sent` is resolved as the request goes out, so that a caller running this in a task of its own can do its
        other work while Redis does this (see `_run_read`).
        """
        rows = len(columns[ts_field])
        ts = columns[ts_field].astype(np.int64)
        chunks = read_args(plan, self.base(plan), ts, id_table(plan, columns, rows))
        async with asyncio.timeout(budget_s):
            try:
                replies = await self._run_read(chunks, use_sha=True, sent=sent)
            except NoScriptError:  # a restarted or different server: send the script itself (rarely)
                replies = await self._run_read(chunks, use_sha=False)
        return decode(plan.reply, ts, replies)

    async def _run_read(
        self, chunks: list[list[bytes]], use_sha: bool, sent: asyncio.Future[None] | None = None
    ) -> list[list[Any]]:
        """One round trip: a read script call per chunk of rows (so Redis serves others in between).

        `sent` is resolved just before the call: redis.asyncio writes a command to its connection before the call
        first waits (when the pool has a connection free), and whoever awaits `sent` runs on a later turn of the
        event loop, so after the write.
        """
        if sent is not None and not sent.done():
            sent.set_result(None)
        sha = self.scripts.read.sha
        if len(chunks) == 1:  # the usual case: one plain command (less client work than a pipeline of one)
            self.round_trips += 1
            if use_sha:
                return [await self.client.evalsha(sha, 0, *chunks[0])]
            return [await self.client.eval(READ_LUA, 0, *chunks[0])]
        pipe = self.client.pipeline(transaction=False)
        for chunk in chunks:
            if use_sha:
                pipe.evalsha(sha, 0, *chunk)
            else:
                pipe.eval(READ_LUA, 0, *chunk)
        self.round_trips += 1
        return await pipe.execute()

    # -- lifecycle --------------------------------------------------------------------------------

    async def prepare(self) -> bool:
        """Load the scripts (so the first Compute is one round trip too); False when the store does not answer."""
        try:
            async with asyncio.timeout(PREPARE_TIMEOUT_S):
                await self.scripts.load(self.client)
            return True
        except FAILURES:
            return False

    async def ping(self) -> bool:
        try:
            async with asyncio.timeout(PING_TIMEOUT_S):
                return bool(await self.client.ping())
        except FAILURES:
            return False

    async def close(self) -> None:
        await self.client.aclose()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
