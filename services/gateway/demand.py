"""The gateway's demand: model calls in flight and requests parked, per model and mesh subset, counted where the
gateway calls a model, and the reporter that streams it to the scaler service (`MESHSERVE_GATEWAY_SCALER_ADDRESS`).

Counting costs a dict lookup and an increment per call; reporting runs as its own task and never touches a
request (a scaler that is down or slow changes nothing for callers).
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Sequence

from services.common.server import transport_options
from services.gateway.settings import GatewaySettings
from services.scaler.api import Demand, DemandKey, DemandReporter

CANARY_SUBSET = "canary"  # the subset of a call with `x-canary: true` (istio/virtualservices.yaml routes it)


def subset_of(version: str, headers: Sequence[tuple[str, str]]) -> str:
    """The mesh subset a model call pins: `v<N>` for a call for version N (it carries `x-model-version: N`, which the
    mesh routes to subset vN), `canary` for one with `x-canary: true`; "" when the mesh picks (its weighted split)."""
    if version:
        return f"v{version}"
    for key, value in headers:
        if key == "x-model-version" and value:
            return f"v{value}"
        if key == "x-canary" and value == "true":
            return CANARY_SUBSET
    return ""


class DemandTracker:
    """Requests per (model, subset): model calls sent or queued and not answered yet (`in_flight`), and requests
    held while the model has no serving replica (`parked`). Every change sets `changed`, which the reporter waits
    on. A key whose counts are back to zero is dropped, so the table holds only what is in flight now.

    The reporter sends `report()`, not `snapshot()`: the most calls in flight at once since the previous report.
    A call shorter than the reporter's interval (most are: milliseconds against 20 ms) would otherwise be gone
    before any report saw it, and a model under a steady light load would look idle to the scaler.

    Example:
        tracker = DemandTracker()
        key = tracker.enter("fraud_mlp", "", headers)
        try:
            ...  # the model call
        finally:
            tracker.leave(key)
    """

    def __init__(self) -> None:
        self._counts: dict[DemandKey, list[int]] = {}  # key -> [in flight, parked]
        self._peaks: dict[DemandKey, int] = {}  # key -> most in flight at once since the last report
        self.changed = asyncio.Event()

    def enter(self, model: str, version: str, headers: Sequence[tuple[str, str]]) -> DemandKey:
        """Count a model call as in flight; returns its key, for `leave`."""
        key = (model, subset_of(version, headers))
        counts = self._counts.get(key)
        if counts is None:
            self._counts[key] = counts = [1, 0]
        else:
            counts[0] += 1
        if counts[0] > self._peaks.get(key, 0):
            self._peaks[key] = counts[0]
        self.changed.set()
        return key

    def leave(self, key: DemandKey) -> None:
        """The call counted by `enter` is answered (or failed)."""
        self._add(key, 0, -1)

    def park(self, model: str, subset: str) -> DemandKey:
        """Count a request as parked (its model or subset has no serving replica yet); returns its key, for
        `unpark`."""
        key = (model, subset)
        self._add(key, 1, 1)
        return key

    def unpark(self, key: DemandKey) -> None:
        """The request counted by `park` left the queue (released, timed out or cancelled)."""
        self._add(key, 1, -1)

    def _add(self, key: DemandKey, index: int, delta: int) -> None:
        counts = self._counts.setdefault(key, [0, 0])
        counts[index] = max(0, counts[index] + delta)
        if not counts[0] and not counts[1]:
            del self._counts[key]
        self.changed.set()

    def snapshot(self) -> dict[DemandKey, Demand]:
        """The demand now (only keys with some)."""
        return {key: Demand(in_flight, parked) for key, (in_flight, parked) in self._counts.items()}

    def report(self) -> dict[DemandKey, Demand]:
        """What the scaler is sent: per key, the most calls in flight at once since the previous report (so a call
        that came and went in between counts) and the requests parked now; then the peaks start again from now."""
        out = {key: Demand(in_flight, parked) for key, (in_flight, parked) in self._counts.items()}
        for key, peak in self._peaks.items():
            now = out.get(key, Demand())
            if peak > now.in_flight:
                out[key] = Demand(peak, now.parked)
        self._peaks = {}
        return out


def gateway_id() -> str:
    """This gateway's id for the scaler: the host name (a pod's name in Kubernetes) and the process id."""
    return f"{socket.gethostname()}:{os.getpid()}"


def demand_reporter(
    settings: GatewaySettings, tracker: DemandTracker, metadata: Sequence[tuple[str, str]] = ()
) -> DemandReporter | None:
    """The reporter of `tracker` to the scaler at `settings.scaler_address` (None when it is unset: no reporting);
    the caller runs its `run()` as a task."""
    if not settings.scaler_address:
        return None
    return DemandReporter(
        settings.scaler_address,
        gateway_id(),
        tracker.report,
        tracker.changed,
        metadata=metadata,
        options=transport_options(settings),
        min_interval_s=settings.demand_interval_s,
    )
