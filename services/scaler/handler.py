"""The scaler's domain handler: every gateway's demand snapshot held while its stream lives, summed per model and
subset, and answered as KEDA's external scaler asks (metric spec, metric value, active, and activity pushed as it
changes).

The servicer only converts protobuf to these calls and back (services/scaler/converters.py); tests use this
directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from services.common.errors import InvalidArgument, NotFound, Unavailable
from services.common.server import Lifecycle
from services.scaler import metrics
from services.scaler.domain import (
    MODEL_KEY,
    SUBSET_KEY,
    TARGET_KEY,
    Demand,
    DemandKey,
    DemandSnapshot,
    MetricSpec,
    MetricValue,
    ReportAck,
    ScaledTarget,
)
from services.scaler.settings import ScalerSettings

log = logging.getLogger(__name__)
MAX_NAME_CHARS = 256  # longest model, subset or gateway name a report may carry


@dataclass(slots=True)
class _Held:
    """A gateway's latest snapshot and the stream that sent it (only that stream's end forgets it)."""

    stream: object
    demand: dict[DemandKey, Demand]


class ScalerHandler:
    """Everything the scaler's RPCs do, in domain types.

    Demand per (model, subset) is the sum over the gateways of in-flight plus parked requests. A gateway's snapshot
    is held while its report stream lives: it is forgotten when the stream ends, when the stream stays silent for
    `settings.stale_after_s` (the gateway or its network is gone though the connection is not), and when this
    replica has drained. Every change wakes the StreamIsActive streams at once, each of which sends a flip of its own
    answer the moment it happens. Liveness and readiness are the serving process's (`lifecycle`).
    """

    def __init__(self, settings: ScalerSettings, lifecycle: Lifecycle | None = None) -> None:
        self.settings = settings
        self.lifecycle = lifecycle if lifecycle is not None else Lifecycle()
        self._gateways: dict[str, _Held] = {}
        self._totals: dict[DemandKey, Demand] = {}
        self._watchers: set[asyncio.Event] = set()
        self._timeouts: set[asyncio.Timeout] = set()  # one per open report stream: drain expires them
        self._closed = False

    # -- liveness and readiness -------------------------------------------------------------------------------

    def live(self) -> bool:
        return self.lifecycle.live

    def ready(self) -> bool:
        return self.lifecycle.ready

    # -- the gateways' reports --------------------------------------------------------------------------------

    async def report(self, reports: AsyncIterator[DemandSnapshot]) -> ReportAck:
        """Take a gateway's snapshots until its stream ends, falls silent for `stale_after_s`, or this replica
        drains; then forget its demand (unless a newer stream of the same gateway has replaced this one)."""
        if self._closed:
            raise Unavailable("the scaler is draining: report to another replica")
        stream = object()
        gateway: str | None = None
        taken = 0
        reason = "closed"
        try:
            while not self._closed:
                timeout = asyncio.timeout(self.settings.stale_after_s)
                self._timeouts.add(timeout)
                try:
                    async with timeout:
                        snapshot = await anext(reports, None)
                except TimeoutError:
                    reason = "draining" if self._closed else "stale"
                    break
                finally:
                    self._timeouts.discard(timeout)
                if snapshot is None:
                    break
                gateway = self._checked(snapshot, gateway)
                self._take(stream, snapshot)
                taken += 1
            else:
                reason = "draining"
        finally:
            if gateway is not None:
                self._forget(gateway, stream, reason)
        return ReportAck(taken)

    @staticmethod
    def _checked(snapshot: DemandSnapshot, gateway: str | None) -> str:
        """The stream's gateway id; InvalidArgument for a snapshot without one, with another, or with bad names."""
        if not snapshot.gateway or len(snapshot.gateway) > MAX_NAME_CHARS:
            raise InvalidArgument(f"a demand report names its gateway (1 to {MAX_NAME_CHARS} characters)")
        if gateway is not None and snapshot.gateway != gateway:
            raise InvalidArgument("a report stream carries one gateway's demand (the gateway id changed)")
        for model, subset in snapshot.demand:
            if not model or len(model) > MAX_NAME_CHARS or len(subset) > MAX_NAME_CHARS:
                raise InvalidArgument(
                    f"a demand entry names its model (and subset) in 1 to {MAX_NAME_CHARS} characters"
                )
        return snapshot.gateway

    def _take(self, stream: object, snapshot: DemandSnapshot) -> None:
        metrics.REPORTS.inc()
        demand = {key: d for key, d in snapshot.demand.items() if d.total > 0}
        held = self._gateways.get(snapshot.gateway)
        if held is not None and held.stream is not stream:
            log.info("gateway %s reconnected: its new stream replaces the old one", snapshot.gateway)
        elif held is None:
            log.info("gateway %s reports its demand", snapshot.gateway)
        elif held.demand == demand:
            return  # a heartbeat: nothing changed
        self._gateways[snapshot.gateway] = _Held(stream, demand)
        self._changed()

    def _forget(self, gateway: str, stream: object, reason: str) -> None:
        held = self._gateways.get(gateway)
        if held is None or held.stream is not stream:
            return
        del self._gateways[gateway]
        metrics.FORGOTTEN.labels(reason).inc()
        log.log(
            logging.WARNING if reason == "stale" else logging.INFO,
            "gateway %s: its demand is forgotten (%s)",
            gateway,
            {"stale": f"no report for {self.settings.stale_after_s} s", "closed": "stream ended"}.get(reason, reason),
        )
        self._changed()

    def _changed(self) -> None:
        """Sum the gateways' demand again, update the gauges and wake every StreamIsActive stream."""
        totals: dict[DemandKey, Demand] = {}
        for held in self._gateways.values():
            for key, demand in held.demand.items():
                totals[key] = totals.get(key, Demand()) + demand
        for model, subset in self._totals.keys() - totals.keys():
            for state in ("in_flight", "parked"):
                with contextlib.suppress(KeyError):  # another handler in this process (tests) removed it
                    metrics.DEMAND.remove(model, subset, state)
        for (model, subset), demand in totals.items():
            metrics.DEMAND.labels(model, subset, "in_flight").set(demand.in_flight)
            metrics.DEMAND.labels(model, subset, "parked").set(demand.parked)
        metrics.GATEWAYS.set(len(self._gateways))
        self._totals = totals
        for event in self._watchers:
            event.set()

    def totals(self) -> dict[DemandKey, Demand]:
        """Demand per (model, subset), summed over the gateways (only keys with some)."""
        return dict(self._totals)

    def gateways(self) -> list[str]:
        """The gateways whose demand is held now."""
        return sorted(self._gateways)

    # -- KEDA's external scaler -------------------------------------------------------------------------------

    def target(self, metadata: Mapping[str, str]) -> ScaledTarget:
        """What a ScaledObject's trigger metadata asks about; InvalidArgument naming the key that is wrong."""
        model = metadata.get(MODEL_KEY, "").strip()
        if not model:
            raise InvalidArgument(
                f"the trigger's metadata has no {MODEL_KEY!r} (the model whose demand scales this object; optional: "
                f"{SUBSET_KEY!r}, {TARGET_KEY!r})"
            )
        subset = metadata.get(SUBSET_KEY, "").strip() or None
        target = self.settings.target_per_replica
        text = metadata.get(TARGET_KEY, "").strip()
        if text:
            try:
                target = float(text)
            except ValueError:
                target = math.nan
            if not (math.isfinite(target) and target > 0):
                raise InvalidArgument(f"the trigger's metadata {TARGET_KEY!r} must be a number above 0 (got {text!r})")
        return ScaledTarget(model, subset, target)

    def demand(self, target: ScaledTarget) -> int:
        """In-flight plus parked requests for the target's model and subset (every subset when it names none)."""
        return sum(d.total for key, d in self._totals.items() if target.covers(key))

    def metric_spec(self, metadata: Mapping[str, str]) -> list[MetricSpec]:
        target = self.target(metadata)
        return [MetricSpec(target.metric_name, target.target_per_replica)]

    def metrics(self, metadata: Mapping[str, str], name: str) -> list[MetricValue]:
        """The current demand, under the metric name GetMetricSpec gave; NotFound for another name."""
        target = self.target(metadata)
        if name != target.metric_name:
            raise NotFound(f"no metric {name!r} for this trigger (its metric is {target.metric_name!r})")
        return [MetricValue(target.metric_name, float(self.demand(target)))]

    def is_active(self, metadata: Mapping[str, str]) -> bool:
        return self.demand(self.target(metadata)) > 0

    async def watch_active(self, metadata: Mapping[str, str]) -> AsyncIterator[bool]:
        """Whether the target is active now, then every change of it the moment a report (or a gateway forgotten)
        changes it; ends when this replica drains (KEDA reconnects)."""
        target = self.target(metadata)
        if self._closed:
            return
        woken = asyncio.Event()
        self._watchers.add(woken)
        metrics.WATCHERS.set(len(self._watchers))
        try:
            active = self.demand(target) > 0
            yield active
            while True:
                await woken.wait()
                woken.clear()
                if self._closed:
                    return
                now = self.demand(target) > 0
                if now != active:
                    active = now
                    metrics.FLIPS.labels(target.model, str(active).lower()).inc()
                    yield active
        finally:
            self._watchers.discard(woken)
            metrics.WATCHERS.set(len(self._watchers))

    # -- lifecycle --------------------------------------------------------------------------------------------

    def drain(self) -> None:
        """A drain hook: serve on for `shutdown_delay_s` (while the endpoints learn that this replica is going),
        then end every report and StreamIsActive stream, so gateways and KEDA reconnect to the next replica."""
        delay = self.settings.shutdown_delay_s
        if delay > 0:
            asyncio.get_running_loop().call_later(delay, self._end_streams)
        else:
            self._end_streams()

    def _end_streams(self) -> None:
        self._closed = True
        loop = asyncio.get_running_loop()
        for timeout in list(self._timeouts):
            timeout.reschedule(loop.time())
        for event in self._watchers:
            event.set()

    async def close(self) -> None:
        self._end_streams()
