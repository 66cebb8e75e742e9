"""Prometheus metrics of the scaler service (`meshserve_scaler_*`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

DEMAND = Gauge(
    "meshserve_scaler_demand",
    "Requests summed over the reporting gateways, by model, subset and state (in_flight, parked).",
    ["model", "subset", "state"],
)
GATEWAYS = Gauge("meshserve_scaler_gateways", "Gateways whose demand the scaler holds now.")
REPORTS = Counter("meshserve_scaler_reports_total", "Demand snapshots received from gateways.")
FORGOTTEN = Counter(
    "meshserve_scaler_gateways_forgotten_total",
    "Gateway demand dropped, by reason: closed (its stream ended), stale (silent past stale_after_s), draining.",
    ["reason"],
)
WATCHERS = Gauge("meshserve_scaler_watchers", "Open StreamIsActive streams (KEDA's external-push triggers).")
FLIPS = Counter(
    "meshserve_scaler_activity_changes_total",
    "Changes of IsActive pushed on StreamIsActive streams, by model and the new state (true, false).",
    ["model", "active"],
)
