"""The feature service's domain handler: validated Compute, Ingest and GetFeatureSet in domain types.

The servicer only converts protobuf to these calls and back (converters.py); tests, the benchmarks and
training (models/feature_replay.py) use this directly. A failed or slow online store, or one that gives back
a value FP32 cannot hold, never fails Compute: aggregates take their defaults and rows are degraded.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping, Sequence

import numpy as np
from opentelemetry import trace

from services.common.budgets import LatencyBudget
from services.common.errors import InvalidArgument, NotFound, ResourceExhausted, Unavailable, quoted
from services.common.redis import redact
from services.common.server import Lifecycle
from services.common.tracing import child_span
from services.feature import metrics
from services.feature.domain import Features, Row
from services.feature.featureset import FeatureSet, load_feature_sets
from services.feature.settings import FeatureSettings
from services.feature.store import FAILURES, AggregateResult, IngestRefused, NotDurable, OnlineStore, StoreFull
from services.feature.store.generation import Loss, reset_rows

log = logging.getLogger(__name__)
tracer = trace.get_tracer("meshserve.feature")

NONFINITE_LOG_EVERY_S = 10.0  # at most one log line per interval about non-finite aggregates from the store


class Throttle:
    """Lets an action through at most once per interval and counts the times it held it back (a log line that a
    bad entity would otherwise repeat on every request)."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.next_at = float("-inf")
        self.held = 0

    def allow(self) -> int | None:
        """None when held back; else how many were held back since the last one let through."""
        now = time.monotonic()
        if now < self.next_at:
            self.held += 1
            return None
        held, self.held, self.next_at = self.held, 0, now + self.every_s
        return held


class FeatureHandler:
    """Everything the feature RPCs do. Build it inside the running event loop."""

    def __init__(self, settings: FeatureSettings, redis_url: str, lifecycle: Lifecycle | None = None) -> None:
        self.settings = settings
        self.lifecycle = lifecycle if lifecycle is not None else Lifecycle()  # the server's, when served
        self.sets = load_feature_sets(settings.features_dir)
        self.store = OnlineStore(redis_url, settings.key_prefix, settings.redis_max_connections, self._store_lost)
        self._store_address = redact(redis_url)  # for the log: no password
        self._watching: asyncio.Task[None] | None = None
        self._nonfinite_log = Throttle(NONFINITE_LOG_EVERY_S)
        # The lookup budget guards against a sick Redis, not a busy machine: it stretches with the store's recent
        # healthy read latency (at most 4x; services.common.budgets).
        self._lookups = LatencyBudget(settings.lookup_budget_ms / 1e3)

    def live(self) -> bool:
        """The process serves and should not be restarted (until SIGTERM)."""
        return self.lifecycle.live

    def ready(self) -> bool:
        """Feature sets loaded and not draining (a down Redis degrades rows; it does not make the service unready)."""
        return self.lifecycle.ready

    def feature_set(self, set_id: str) -> FeatureSet:
        found = self.sets.get(set_id)
        if found is None:
            raise NotFound(f"unknown feature set {quoted(set_id)} (have: {', '.join(sorted(self.sets)) or 'none'})")
        return found

    def _check_batch(self, n: int, what: str) -> None:
        if n == 0:
            raise InvalidArgument(f"no {what}s given")
        if n > self.settings.max_batch:
            raise InvalidArgument(f"{n} {what}s in one request; at most {self.settings.max_batch}")

    def _budget_s(self, budget_ms: float, rows: int) -> float:
        """The caller's budget, else the default plus the per-row allowance; stretched by recent read latency."""
        s = self.settings
        return self._lookups.stretched((budget_ms or s.lookup_budget_ms + s.lookup_budget_per_row_ms * rows) / 1e3)

    async def compute(self, set_id: str, rows: Sequence[Row], budget_ms: float = 0.0) -> Features:
        """The FP32 feature matrix of a batch of rows, aggregates as of each row's event time."""
        fs = self.feature_set(set_id)
        self._check_batch(len(rows), "row")
        if not (math.isfinite(budget_ms) and budget_ms >= 0):
            raise InvalidArgument(f"budget_ms must be a finite number of milliseconds, 0 or more (got {budget_ms})")
        start = time.perf_counter()
        columns = fs.columns(rows, max_field_bytes=self.settings.max_field_bytes)
        reading: asyncio.Task[tuple[AggregateResult | None, int]] | None = None
        if fs.has_aggregates:  # started first: the work below runs while Redis works
            reading = await self._start_read(fs, columns, set_id, self._budget_s(budget_ms, len(rows)))
        try:
            prepared = fs.prepare(columns)  # the static lookups and request transforms
            online, trips = await reading if reading is not None else (None, 0)
        finally:
            if reading is not None and not reading.done():  # cancelled (or failed) before the read came back
                reading.cancel()
        result = fs.finish(prepared, online)
        if online is not None:
            self._mark_reset(fs, columns, result)
        if result.nonfinite is not None:
            self._report_nonfinite(fs, columns, result.nonfinite)
        metrics.COMPUTE_SECONDS.labels(set_id).observe(time.perf_counter() - start)
        metrics.ROWS.labels(set_id).inc(len(rows))
        metrics.REDIS_ROUND_TRIPS.labels(set_id).observe(trips)
        if degraded := int(result.degraded.sum()):
            metrics.DEGRADED_ROWS.labels(set_id).inc(degraded)
        if defaulted := int(result.defaulted.sum()):
            metrics.DEFAULTED_ROWS.labels(set_id).inc(defaulted)
        return result

    def _mark_reset(self, fs: FeatureSet, columns: Mapping[str, np.ndarray], result: Features) -> None:
        """Degrade the rows whose windows reach back before a loss of the store's data (their aggregates count only
        what came after it): `features_store_reset`, until the feature set's longest window has passed."""
        reset = reset_rows(columns[fs.spec.timestamp_field], self.store.watch.reset_at, fs.plan.lookback_s)
        reset &= ~result.degraded
        if n := int(reset.sum()):
            result.reset = reset
            result.degraded = result.degraded | reset
            metrics.RESET_ROWS.labels(fs.id).inc(n)

    def _store_lost(self, loss: Loss) -> None:
        """A loss of the store's data learnt of: a metric and a log line (never silent)."""
        metrics.STORE_RESETS.labels("here" if loss.noticed_here else "peer").inc()
        metrics.STORE_RESET_TIME.set(loss.reset_at)
        longest = max((fs.plan.lookback_s for fs in self.sets.values()), default=0)
        log.error(
            "the online store at %s lost its data (its generation marker is gone%s): rows whose windows reach back "
            "before %s are degraded (features_store_reset) for up to %.1f h",
            self._store_address,
            "" if loss.noticed_here else ", noticed by another replica",
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(loss.reset_at)),
            longest / 3600,
        )

    async def _start_read(
        self, fs: FeatureSet, columns: dict[str, np.ndarray], set_id: str, budget_s: float
    ) -> asyncio.Task[tuple[AggregateResult | None, int]]:
        """The online read in a task of its own, once its request is on its way to Redis (the store says when)."""
        sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        reading = asyncio.ensure_future(self._read_online(fs, columns, set_id, budget_s, sent))
        try:
            await sent
        except asyncio.CancelledError:
            reading.cancel()
            raise
        return reading

    async def _read_online(
        self, fs: FeatureSet, columns: dict[str, np.ndarray], set_id: str, budget_s: float, sent: asyncio.Future[None]
    ) -> tuple[AggregateResult | None, int]:
        """(every aggregate of the rows or None when the store failed or ran past the budget, round trips made).

        `sent` is resolved once the request is out, or at once when it is not about to go (a fault delay, a failure).
        """
        rows = len(columns[fs.spec.timestamp_field])
        before = self.store.round_trips
        with child_span(tracer, "feature.online_lookup", {"feature.rows": rows, "feature.set": set_id}):
            try:
                if self.settings.fault_delay_ms > 0:  # fault injection (drills, tracing tests)
                    sent.set_result(None)
                    await asyncio.sleep(self.settings.fault_delay_ms / 1e3)
                online = await self._timed_read(fs, columns, budget_s, sent)
            except FAILURES as exc:
                metrics.REDIS_ERRORS.labels("read", type(exc).__name__).inc()
                log.debug("online store read failed, degrading %d rows: %r", rows, exc)
                online = None
            finally:
                if not sent.done():
                    sent.set_result(None)
        return online, self.store.round_trips - before

    async def _timed_read(
        self, fs: FeatureSet, columns: Mapping[str, np.ndarray], budget_s: float, sent: asyncio.Future[None]
    ) -> AggregateResult:
        """The store's read within `budget_s` (TimeoutError past it). A read past its budget is not cancelled: it
        goes on up to the budget's ceiling, so its latency still teaches the budget what this machine takes now
        (were only reads inside the budget samples, a machine that suddenly got busier would never stretch it)."""
        start = time.perf_counter()
        ceiling_s = budget_s * self._lookups.stretch_max
        read = asyncio.ensure_future(self.store.read(fs.plan, columns, fs.spec.timestamp_field, ceiling_s, sent))

        def learn(task: asyncio.Future[AggregateResult]) -> None:
            if not task.cancelled() and task.exception() is None:
                self._lookups.observe(time.perf_counter() - start)

        read.add_done_callback(learn)
        try:
            return await asyncio.wait_for(asyncio.shield(read), budget_s)
        except asyncio.CancelledError:
            read.cancel()  # the caller went away: nobody waits for this read
            raise

    def _report_nonfinite(self, fs: FeatureSet, columns: Mapping[str, np.ndarray], nonfinite: np.ndarray) -> None:
        """Count the store's non-finite aggregates by feature; log the first (feature, entity) once per interval."""
        for j in np.flatnonzero(nonfinite.any(axis=0)).tolist():
            metrics.NONFINITE.labels(fs.id, fs.aggregate_names[j]).inc(int(nonfinite[:, j].sum()))
        held = self._nonfinite_log.allow()
        if held is None:
            return
        r, j = (int(v) for v in np.argwhere(nonfinite)[0])
        kind, field = fs.aggregate_entity(j)
        log.warning(
            "%s: the online store gave a non-finite %s for %s %s (%d values in %d rows of this call took their "
            "defaults, degraded; %d such calls not logged since the last line)",
            fs.id,
            fs.aggregate_names[j],
            kind,
            quoted(str(columns[field][r])),
            int(nonfinite.sum()),
            int(nonfinite.any(axis=1).sum()),
            held,
        )

    async def ingest(self, set_id: str, events: Sequence[Row]) -> int:
        """Apply events to the online aggregates (all or none, one round trip); Unavailable when the store is out.

        InvalidArgument names the first event and field whose value (or whose sum with what its bucket holds) the
        feature set's aggregates cannot hold in FP32; nothing of such a request is written.
        """
        fs = self.feature_set(set_id)
        self._check_batch(len(events), "event")
        columns = fs.event_columns(events, self.settings.max_field_bytes)
        try:
            n = await self.store.ingest(
                fs.plan, columns, fs.spec.timestamp_field, self.settings.ingest_timeout_ms / 1e3
            )
        except IngestRefused as exc:
            raise InvalidArgument(
                f"event {exc.event}: field {exc.field!r} would bring a bucket's sum to {exc.total}, more than its "
                f"aggregates can hold in FP32 (|sum| <= {exc.cap}); nothing of this request was written"
            ) from None
        except StoreFull:
            metrics.STORE_FULL.labels(set_id).inc()
            log.warning("online store at %s is full (maxmemory, noeviction): Ingest refused", self._store_address)
            raise ResourceExhausted(
                f"the online feature store ({self._store_address}) is full: it keeps every aggregate (noeviction) "
                "and has reached its maxmemory; nothing of this request was written"
            ) from None
        except NotDurable as exc:
            metrics.REDIS_ERRORS.labels("ingest", "NotDurable").inc()
            raise Unavailable(f"online store: {exc}; the events may be applied (at least once if sent again)") from exc
        except FAILURES as exc:  # the client library's text names addresses: it goes to the log only
            metrics.REDIS_ERRORS.labels("ingest", type(exc).__name__).inc()
            log.debug("online store ingest failed: %r", exc)
            raise Unavailable(f"online store unavailable ({type(exc).__name__})") from exc
        finally:
            if self.store.durable is not None:
                metrics.STORE_DURABLE.set(1 if self.store.durable else 0)
        metrics.INGESTED.labels(set_id).inc(n)
        return n

    async def start(self) -> None:
        """Load the store's scripts, so the first Compute is one round trip too. A store that does not answer is a
        warning, not a failure: aggregates take their defaults until it answers."""
        if not await self.store.prepare():
            log.warning(
                "redis at %s does not answer; aggregates take their defaults until it does", self._store_address
            )
        self._watching = asyncio.ensure_future(self._watch_generation())

    async def _watch_generation(self) -> None:
        """Read the store's generation marker every generation_check_s (new connections read it too)."""
        while True:
            try:
                async with asyncio.timeout(self.settings.generation_check_s):
                    await self.store.check_generation()
                metrics.STORE_RESET_TIME.set(self.store.watch.reset_at)
            except FAILURES as exc:
                log.debug("generation marker check failed: %r", exc)
            await asyncio.sleep(self.settings.generation_check_s)

    async def close(self) -> None:
        if self._watching is not None:
            self._watching.cancel()
        await self.store.close()
