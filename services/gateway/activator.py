"""The activator: a request for a model that has no serving replica waits here ("parked") until a replica serves the
model, then goes again; it never waits past its own deadline nor `cold_start_wait_s`.

A model whose mesh subset has no endpoints (scaled to zero) makes Envoy answer at once with UNAVAILABLE "no healthy
upstream" (`is_cold`). A call that pins no subset is first sent again at once (the mesh's weighted split may have
picked a subset at zero while another serves); then the request parks under its (model, subset), which the demand
tracker reports to the scaler at once, so KEDA (or the local autoscaler) wakes the model. One prober per parked key
asks the model's readiness (ModelReady, routed like the request) every `probe_interval_s` and releases every request
parked on the key the moment it says ready; a request sent again that finds the model cold again parks again, all
within one overall wait. A parked request does not hold its admission slot (it uses no capacity), and each wait is a
`park` span, counted in `meshserve_gateway_park*` metrics.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
from opentelemetry import trace

from services.common.errors import DeadlineExceeded, MeshserveError, Unavailable
from services.common.tracing import child_span
from services.gateway import metrics
from services.gateway.admission import current_permit
from services.gateway.demand import DemandTracker, subset_of
from services.gateway.upstream import UNTRACED, Deadline, ReadinessUpstream
from services.scaler.api import DemandKey

log = logging.getLogger(__name__)
tracer = trace.get_tracer("meshserve.gateway")
R = TypeVar("R")

COLD_MARK = "no healthy upstream"  # Envoy's local reply when a cluster (a subset) has no endpoints
RESENDS = 2  # immediate re-sends of a cold call that pins no subset, before it parks
PROBE_TIMEOUT_S = 1.0


def is_cold(error: MeshserveError) -> bool:
    """Whether a failed model call says the model (or its subset) has no serving replica: Envoy's local reply,
    UNAVAILABLE "no healthy upstream" (a replica that is up but not ready answers otherwise)."""
    return error.code == grpc.StatusCode.UNAVAILABLE and COLD_MARK in str(error)


class ColdStart(Unavailable):
    """The model has no serving replica and the request does not wait (any longer): `outcome` says why, `cap` (it
    waited `cold_start_wait_s`), `full` (the model's park queue is full) or `off` (waiting is configured off, or the
    call is a remedy's). A pipeline's remedies may answer it, marked `cold_start:<remedy>`."""

    def __init__(self, message: str, outcome: str) -> None:
        super().__init__(message)
        self.outcome = outcome


class ParkedPastDeadline(DeadlineExceeded):
    """The request's deadline passed while it was parked: nothing is left of it, so no remedy answers."""


@dataclass(frozen=True)
class Target:
    """What a request calls: `model` (`version` as ModelReady names it, "" for any) through the mesh with `routing`,
    the headers that decide where the call goes (`x-model-version`, `x-canary`, ...; no trace context)."""

    model: str
    version: str = ""
    routing: tuple[tuple[str, str], ...] = ()

    @property
    def subset(self) -> str:
        """The mesh subset the call pins ("" when the mesh's weighted split picks): a pinned version first."""
        return subset_of(dict(self.routing).get("x-model-version", ""), self.routing)

    def describe(self) -> str:
        return f"model {self.model!r}" + (f" (subset {self.subset})" if self.subset else "")


@dataclass(eq=False)
class _Key:
    """The requests parked on one (model, subset), and its prober."""

    target: Target  # the first parked request's: what the prober asks for, routed like it
    parked: int = 0
    released: asyncio.Event = field(default_factory=asyncio.Event)  # set once per release, then replaced
    prober: asyncio.Task[None] | None = None


class Activator:
    """Holds requests for a model with no serving replica and releases them when one serves it. One per gateway,
    shared by every pipeline runner and the forwarder (so the park limit and the probers are per model).

    Example:
        activator = Activator(tracker, model_client, wait_s=20.0)
        target = Target("fraud_mlp", "", routing)
        result = await activator.call(target, lambda: model_client.infer(...), deadline)

    Args:
        demand: the gateway's demand tracker: each parked request is counted with `park` until it leaves.
        upstream: the model service through the mesh, for the probers' ModelReady.
        wait_s: the longest a request waits for a cold model (from its first park); 0: never waits (a cold call
            fails at once with ColdStart, outcome `off`).
        park_limit: the most requests parked per model; beyond, ColdStart (outcome `full`).
        probe_interval_s: how often a parked key's prober asks readiness.
    """

    def __init__(
        self,
        demand: DemandTracker,
        upstream: ReadinessUpstream,
        *,
        wait_s: float = 20.0,
        park_limit: int = 1000,
        probe_interval_s: float = 0.05,
    ) -> None:
        self.demand = demand
        self.upstream = upstream
        self.wait_s = wait_s
        self.park_limit = park_limit
        self.probe_interval_s = probe_interval_s
        self._keys: dict[DemandKey, _Key] = {}
        self._per_model: dict[str, int] = {}

    def parked(self, model: str) -> int:
        """Requests parked for `model` now (every subset)."""
        return self._per_model.get(model, 0)

    async def call(
        self, target: Target, send: Callable[[], Awaitable[R]], deadline: Deadline, *, park: bool = True
    ) -> R:
        """`send()`'s answer once a replica serves the target. A cold answer is sent again at once (up to RESENDS
        times, only when the call pins no subset), then the request parks and is sent again when released. Raises
        `send`'s other errors as they are, ColdStart when it does not wait (any longer; `park=False` never waits),
        ParkedPastDeadline when its deadline passes while parked."""
        since: float | None = None  # when the request first parked
        while True:
            resends = 0 if target.subset else RESENDS
            while True:
                try:
                    return await send()
                except MeshserveError as exc:
                    if not is_cold(exc):
                        raise
                    cold = exc
                if not resends:
                    break
                resends -= 1
            if not park or self.wait_s <= 0:
                what = target.describe()
                raise ColdStart(f"{what} is starting (no replica serves it yet); retry", "off") from cold
            since = time.monotonic() if since is None else since
            await self._park(target, deadline, since)

    async def _park(self, target: Target, deadline: Deadline, since: float) -> None:
        """Wait until a replica serves the target (returns), or raise ColdStart (cap, full) or ParkedPastDeadline."""
        what = target.describe()
        if self.parked(target.model) >= self.park_limit:
            self._count(target, "full", 0.0)
            with child_span(tracer, "park", self._attributes(target, "full", 0.0)):
                pass
            raise ColdStart(
                f"{what} is starting and its queue is full ({self.park_limit} requests wait); retry", "full"
            )
        state = self._enter(target)
        permit = current_permit()
        if permit is not None:
            permit.step_out()  # a parked request uses no capacity: its admission slot is free meanwhile
        start = time.monotonic()
        outcome = "cancelled"
        with child_span(tracer, "park", {"model": target.model, "subset": target.subset}) as span:
            try:
                outcome = await self._wait(state.released, deadline.caller_end, since + self.wait_s)
            finally:
                parked_s = time.monotonic() - start
                deadline.pause(parked_s)  # the pipeline's total budgets work; the caller's deadline still binds
                self._leave(target, state)
                if permit is not None:
                    permit.step_in()
                self._count(target, outcome, parked_s)
                span.set_attributes(self._attributes(target, outcome, parked_s))
        if outcome == "deadline":
            raise ParkedPastDeadline(f"deadline passed while {what} was starting (parked {parked_s * 1e3:.0f} ms)")
        if outcome == "cap":
            raise ColdStart(f"{what} is starting (no replica has served it for {self.wait_s:g} s); retry", "cap")

    @staticmethod
    async def _wait(released: asyncio.Event, deadline_end: float, cap_end: float) -> str:
        """`released` when the event is set; else `deadline` or `cap`, whichever comes first, never before it."""
        while not released.is_set():
            left = min(deadline_end, cap_end) - time.monotonic()
            if left <= 0:
                return "deadline" if deadline_end <= cap_end else "cap"
            try:
                await asyncio.wait_for(released.wait(), left)
            except TimeoutError:
                pass  # checked again: a timer may fire a hair early
        return "released"

    def _enter(self, target: Target) -> _Key:
        key = (target.model, target.subset)
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = _Key(target)
        state.parked += 1
        self._per_model[target.model] = self.parked(target.model) + 1
        metrics.PARKED.labels(target.model).set(self._per_model[target.model])
        self.demand.park(*key)
        if state.prober is None:  # in a context of its own: not the first request's span, nor its permit
            state.prober = asyncio.create_task(self._probe(state), context=contextvars.Context())
        return state

    def _leave(self, target: Target, state: _Key) -> None:
        key = (target.model, target.subset)
        state.parked -= 1
        left = self._per_model[target.model] = self.parked(target.model) - 1
        if not left:
            del self._per_model[target.model]
        metrics.PARKED.labels(target.model).set(left)
        self.demand.unpark(key)
        if not state.parked:  # nothing parked: the prober stops, a later park starts another
            if state.prober is not None:
                state.prober.cancel()
            if self._keys.get(key) is state:
                del self._keys[key]

    async def _probe(self, state: _Key) -> None:
        """Every `probe_interval_s` while anything is parked on the key: ask readiness; on ready, release them all."""
        while state.parked:
            await asyncio.sleep(self.probe_interval_s)
            if state.parked and await self._ready(state.target):
                state.released.set()
                state.released = asyncio.Event()

    async def _ready(self, target: Target) -> bool:
        """Whether a replica the mesh routes `target`'s calls to has the model ready ("no healthy upstream" and
        any other failure: not yet)."""
        try:
            ready = await self.upstream.ready(
                target.model, target.version, timeout_s=PROBE_TIMEOUT_S, metadata=(*target.routing, *UNTRACED)
            )
        except MeshserveError as exc:
            if not is_cold(exc):
                log.debug("readiness of %s: %s", target.describe(), exc)
            return False
        except Exception:  # never let a prober die: its requests would wait for nothing
            log.exception("readiness probe of %s failed", target.describe())
            return False
        return ready

    @staticmethod
    def _attributes(target: Target, outcome: str, parked_s: float) -> dict[str, str | float]:
        return {"model": target.model, "subset": target.subset, "outcome": outcome, "parked_ms": parked_s * 1e3}

    @staticmethod
    def _count(target: Target, outcome: str, parked_s: float) -> None:
        metrics.PARK_OUTCOMES.labels(target.model, outcome).inc()
        if outcome != "full":
            metrics.PARKED_SECONDS.labels(target.model).observe(parked_s)

    async def close(self) -> None:
        """Stop the probers (at shutdown; requests still parked leave at their deadline or cap)."""
        probers = []
        for state in self._keys.values():
            if state.prober is not None:
                state.prober.cancel()
                probers.append(state.prober)
                state.prober = None
        await asyncio.gather(*probers, return_exceptions=True)
