"""The online store's Redis client: OnlineStore reads and writes the aggregates of feature sets in one Redis."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import NoScriptError, OutOfMemoryError, RedisError, ResponseError

from services.common.redis import connect
from services.feature.store.decode import AggregateResult, decode
from services.feature.store.generation import MARKER_KEY, Generation, GenerationWatch, Loss
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

log = logging.getLogger(__name__)
Command = Callable[..., Awaitable[Any]]  # sends one command, returns its reply


class IngestRefused(Exception):
    """ingest.lua refused a request whole (nothing written): an event would bring a bucket's sum past its cap."""

    def __init__(self, event: int, field: str, total: str, cap: str) -> None:
        super().__init__(f"event {event}: field {field!r}: a bucket's sum would be {total} (at most {cap})")
        self.event, self.field, self.total, self.cap = event, field, total, cap


class StoreFull(Exception):
    """The store refused a write for want of memory (maxmemory with noeviction): nothing of it was written."""


class NotDurable(Exception):
    """The store applied a write but did not confirm it in its append-only file within the time allowed."""


class OnlineStore:
    """Reads and writes the aggregates of feature sets in one Redis (or Valkey).

    An ingest answers once the store has its writes in its append-only file on disk (WAITAOF 1 0: the local
    fsync), when the store can say so; `durable` tells whether it can (None: not known yet; False: the server has
    no WAITAOF or no append-only file: writes are applied unconfirmed, and that is logged once per server).
    The generation marker (generation.py) is read on every new connection and by `check_generation`; each loss of
    the store's data learnt of goes to `on_loss`.
    """

    def __init__(
        self, url: str, prefix: str, max_connections: int = 64, on_loss: Callable[[Loss], None] | None = None
    ) -> None:
        self.prefix = prefix
        self.client = connect(
            url, max_connections=max_connections, command_timeout_s=COMMAND_TIMEOUT_S, on_connect=self._connected
        )
        self.scripts = Scripts.register(self.client)
        self.round_trips = 0  # requests sent by `read` (one per Compute that has aggregates)
        self.marker_key = prefix + MARKER_KEY
        self.watch = GenerationWatch()
        self.on_loss = on_loss
        self.durable: bool | None = None
        self.not_durable_why = ""  # the server's answer to WAITAOF when `durable` is False

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
                reply = await self._apply(ingest_plan, events, timeout_s)
            except NoScriptError:  # a restarted or different server (nothing was applied): load it and retry once
                self.scripts.ingest.sha = await self.client.script_load(INGEST_LUA)
                reply = await self._apply(ingest_plan, events, timeout_s)
        if isinstance(reply, list):
            event, field, total, cap = reply
            raise IngestRefused(int(event), _text(field), _text(total), _text(cap))
        return rows

    async def _apply(self, ingest_plan: str, events: str, timeout_s: float) -> Any:
        """One ingest.lua call and, in the same round trip, WAITAOF 1 0 for it (unless the server cannot): the reply
        of the script once its writes are on disk. StoreFull when the store is out of memory; NotDurable when it
        applied the writes but did not confirm them within `timeout_s`."""
        sha = self.scripts.ingest.sha
        try:
            if self.durable is False:
                return await self.client.evalsha(sha, 0, ingest_plan, events)
            pipe = self.client.pipeline(transaction=False)
            pipe.evalsha(sha, 0, ingest_plan, events)
            pipe.execute_command("WAITAOF", 1, 0, max(1, int(timeout_s * 1e3)))
            applied, synced = await pipe.execute(raise_on_error=False)
            if isinstance(applied, Exception):
                raise applied
        except OutOfMemoryError as exc:  # refused at the script's first write: nothing was applied
            raise StoreFull(str(exc)) from None
        self._confirmed(synced)
        return applied

    def _confirmed(self, synced: Any) -> None:
        """Take in WAITAOF's reply: [local fsyncs, replicas], or the server's refusal (no such command before Redis
        7.2 / Valkey 7.2; no append-only file)."""
        if isinstance(synced, ResponseError):
            if self.durable is not False:
                log.warning(
                    "the online store cannot confirm writes on disk (WAITAOF: %s): Ingest answers without that "
                    "confirmation until it can (meshserve_feature_store_durable 0)",
                    synced,
                )
            self.durable, self.not_durable_why = False, str(synced)
            return
        if isinstance(synced, Exception):
            raise synced
        if int(synced[0]) < 1:
            raise NotDurable("the store did not confirm the write in its append-only file in time")
        self.durable = True

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

    # -- generation marker ------------------------------------------------------------------------

    async def check_generation(self) -> None:
        """Read the marker (one GET) and act on it (generation.py); raises FAILURES when the store does not answer."""
        await self._check(self.client.execute_command)

    async def _connected(self, connection: AbstractConnection) -> None:
        """Every new connection reads the marker before its first command: a restarted store is met this way."""
        if self.durable is False:
            self.durable = None  # perhaps another server now: ask it again

        async def on_connection(*args: Any) -> Any:
            await connection.send_command(*args)
            return await connection.read_response()

        try:
            await self._check(on_connection)
        except RedisError as exc:  # the command this connection was made for finds out for itself
            log.debug("generation check on a new connection failed: %r", exc)

    async def _check(self, command: Command) -> None:
        before = len(self.watch.losses)
        write = self.watch.seen(Generation.decode(await command("GET", self.marker_key)), time.time())
        if write is not None:
            if await command("SET", self.marker_key, write.encode(), "NX"):
                self.watch.written(write)
            else:  # another replica wrote one first: that one it is
                self.watch.seen(Generation.decode(await command("GET", self.marker_key)), time.time())
        if self.on_loss is not None:
            for loss in self.watch.losses[before:]:
                self.on_loss(loss)

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
