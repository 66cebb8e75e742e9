"""The Redis tier: batched MGET, pipelined SET with expiry, invalidation over pub/sub, a circuit that probes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import cast

from redis.exceptions import RedisError

from services.cache import metrics
from services.cache.domain import Invalidation
from services.cache.entry import Entry
from services.common.redis import connect

log = logging.getLogger(__name__)

FAILURES = (RedisError, OSError, TimeoutError)
# Every command here is GET/SET-sized (an MGET of at most max_batch keys, one pipelined write, a PUBLISH), and
# a cache must fail fast: a Redis that takes longer than this is treated as failed (the lookup misses).
COMMAND_TIMEOUT_S = 1.0


class Circuit:
    """Opens after `threshold` consecutive failures; closed again by a successful probe."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.failures = 0
        self.open = False

    def success(self) -> None:
        self.failures = 0

    def failure(self) -> bool:
        """Count a failure; True when this one opened the circuit."""
        self.failures += 1
        if not self.open and self.failures >= self.threshold:
            self.open = True
            metrics.CIRCUIT_OPEN.set(1)
            return True
        return False

    def close(self) -> None:
        self.open = False
        self.failures = 0
        metrics.CIRCUIT_OPEN.set(0)


class RedisTier:
    """Entries in Redis under `prefix + key`, plus index sets per pipeline and per model version."""

    def __init__(
        self, url: str, prefix: str, circuit_failures: int, probe_interval_s: float, max_connections: int
    ) -> None:
        self.prefix = prefix.encode()
        self.probe_interval_s = probe_interval_s
        self.circuit = Circuit(circuit_failures)
        metrics.CIRCUIT_OPEN.set(0)
        self.client = connect(url, max_connections=max_connections, command_timeout_s=COMMAND_TIMEOUT_S)
        self.errors = 0
        self._probe: asyncio.Task[None] | None = None
        self.subscribed = asyncio.Event()

    def available(self) -> bool:
        return not self.circuit.open

    def _key(self, key: bytes) -> bytes:
        return self.prefix + key

    def _pipeline_index(self, pipeline: str) -> bytes:
        return self.prefix + b"idx:p:" + pipeline.encode()

    def _model_prefix(self, model_name: str) -> bytes:
        """Where a model's index keys start: the name's length goes first, so that no other name (one that
        extends this one past a colon, say) shares the prefix, and the version that follows is unambiguous."""
        name = model_name.encode()
        return self.prefix + b"idx:m:" + str(len(name)).encode() + b":" + name + b":"

    def _model_index(self, model_name: str, model_version: str) -> bytes:
        return self._model_prefix(model_name) + model_version.encode()

    def failed(self, op: str, exc: BaseException) -> None:
        """Count a failure; open the circuit (and start probing) after enough in a row."""
        self.errors += 1
        metrics.REDIS_ERRORS.labels(op, type(exc).__name__).inc()
        if self.circuit.failure():
            log.warning("redis circuit open after %d failures (last: %r)", self.circuit.failures, exc)
            self._probe = asyncio.get_running_loop().create_task(self._probe_until_healthy())

    async def mget(self, keys: Sequence[bytes], budget_s: float) -> list[Entry | None]:
        """Entries for keys (None where absent); raises on failure or past the budget (the caller fails open)."""
        async with asyncio.timeout(budget_s):
            # Replies are bytes: the client does not decode responses.
            raw = cast(list[bytes | None], await self.client.mget([self._key(k) for k in keys]))
        self.circuit.success()
        return [None if r is None else self._decode(k, r) for k, r in zip(keys, raw, strict=True)]

    def _decode(self, key: bytes, data: bytes) -> Entry | None:
        """Each value starts with its own key: a reply that is not for this key is refused (a miss), never served."""
        n = len(key)
        if not data or data[0] != n or not data.startswith(key, 1):
            metrics.REDIS_ERRORS.labels("lookup", "KeyMismatch").inc()
            return None
        return Entry.decode(data, 1 + n)

    async def set_many(self, items: Sequence[tuple[bytes, Entry]], ttl_cap_s: float, timeout_s: float) -> None:
        """SET with expiry at each entry's stale time, and index the keys for invalidation, in one round trip."""
        now = time.time()
        pipe = self.client.pipeline(transaction=False)
        indexes: dict[bytes, list[bytes]] = {}
        for key, entry in items:
            px = max(1, int((entry.stale_until - now) * 1000))
            pipe.set(self._key(key), bytes((len(key),)) + key + entry.encode(), px=px)
            indexes.setdefault(self._pipeline_index(entry.pipeline), []).append(key)
            indexes.setdefault(self._model_index(entry.model_name, entry.model_version), []).append(key)
        for index, keys in indexes.items():
            pipe.sadd(index, *keys)
            pipe.expire(index, int(ttl_cap_s) + 1)
        async with asyncio.timeout(timeout_s):
            await pipe.execute()
        self.circuit.success()

    async def invalidate(self, pipeline: str, model_name: str, model_version: str) -> int:
        """Delete the entries of a pipeline or model version (all versions when model_version is empty); names
        match exactly (a name is never a SCAN pattern)."""
        if pipeline:
            indexes = [self._pipeline_index(pipeline)]
        elif model_version:
            indexes = [self._model_index(model_name, model_version)]
        else:
            pattern = glob_literal(self._model_prefix(model_name)) + b"*"
            indexes = [k async for k in self.client.scan_iter(match=pattern, count=1000)]
        removed = 0
        for index in indexes:
            members = list(cast(set[bytes], await self.client.smembers(index)))
            for i in range(0, len(members), 1000):
                removed += await self.client.delete(*[self._key(k) for k in members[i : i + 1000]])
            await self.client.delete(index)
        return removed

    async def publish_invalidation(self, invalidation: Invalidation) -> None:
        """Tell every replica (watch_invalidations) to apply it to its own L1."""
        async with asyncio.timeout(COMMAND_TIMEOUT_S):
            await self.client.publish(self.prefix + b"invalidate", encode_invalidation(invalidation))

    async def watch_invalidations(self, apply: Callable[[Invalidation], object], on_gap: Callable[[], None]) -> None:
        """Apply every replica's invalidations to this one's L1; after losing the channel, call on_gap.

        Runs until cancelled. Messages published while this replica was disconnected are lost, so on
        resubscribing `on_gap` drops the whole L1 rather than risk serving an invalidated entry.
        """
        lost = False
        while True:
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.prefix + b"invalidate")
                if lost:
                    on_gap()
                    lost = False
                self.subscribed.set()
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        apply(decode_invalidation(message["data"]))
            except FAILURES as exc:
                log.debug("invalidation channel lost: %r", exc)
                lost = True
                self.subscribed.clear()
            finally:
                try:
                    await pubsub.aclose()
                except FAILURES:
                    pass
            await asyncio.sleep(self.probe_interval_s)

    async def _probe_until_healthy(self) -> None:
        while self.circuit.open:
            await asyncio.sleep(self.probe_interval_s)
            try:
                async with asyncio.timeout(max(0.5, self.probe_interval_s)):
                    await self.client.ping()
            except FAILURES as exc:
                log.debug("redis probe failed: %r", exc)
                continue
            log.info("redis probe succeeded: circuit closed")
            self.circuit.close()

    async def ping(self) -> bool:
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT_S):
                return bool(await self.client.ping())
        except FAILURES:
            return False

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        await self.client.aclose()


_GLOB_SPECIAL = frozenset(b"*?[]\\")


def glob_literal(data: bytes) -> bytes:
    """`data` as a Redis glob pattern that matches exactly itself (every special character escaped)."""
    out = bytearray()
    for byte in data:
        if byte in _GLOB_SPECIAL:
            out.append(0x5C)  # backslash
        out.append(byte)
    return bytes(out)


def encode_invalidation(invalidation: Invalidation) -> bytes:
    """The pub/sub message between replicas: `p\\0pipeline` or `m\\0model\\0version` (every replica reads it)."""
    if invalidation.pipeline:
        return b"p\0" + invalidation.pipeline.encode()
    return b"m\0" + f"{invalidation.model_name}\0{invalidation.model_version}".encode()


def decode_invalidation(message: bytes) -> Invalidation:
    kind, _, rest = message.partition(b"\0")
    if kind == b"p":
        return Invalidation(pipeline=rest.decode())
    name, _, version = rest.decode().partition("\0")
    return Invalidation(model_name=name, model_version=version)
