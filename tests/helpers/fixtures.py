"""Test settings, inputs and a feature set shared by the in-process and the real-Valkey tests of the cache and
feature services."""

from __future__ import annotations

from typing import Any

from services.cache.settings import CacheSettings
from services.feature.settings import FeatureSettings

T0 = 1_700_000_000  # a Tuesday, 22:13:20 UTC

# A feature set of online aggregates only. Two entities; user has bucket groups of 10 s and 1 min (two bands of
# one sorted set), merchant one of 12 s.
AGG_YAML = """\
name: agg
version: 1
timestamp_field: ts
inputs: {ts: int64, user: string, merchant: string, amount: double}
entities: {user: user, merchant: merchant}
features:
  - {name: u_count_1m, kind: aggregate, entity: user, op: count, window: 1m, bucket: 10s}
  - {name: u_count_5m, kind: aggregate, entity: user, op: count, window: 5m, bucket: 1m}
  - {name: u_sum_5m, kind: aggregate, entity: user, op: sum, field: amount, window: 5m, bucket: 1m}
  - {name: u_mean_5m, kind: aggregate, entity: user, op: mean, field: amount, window: 5m, bucket: 1m, default: -1}
  - {name: u_max_1m, kind: aggregate, entity: user, op: max, field: amount, window: 1m, bucket: 10s, default: -7}
  - {name: u_merchants_5m, kind: aggregate, entity: user, op: distinct, field: merchant, window: 5m, bucket: 1m}
  - {name: u_since_last, kind: aggregate, entity: user, op: since_last, default: -1}
  - {name: m_count_2m, kind: aggregate, entity: merchant, op: count, window: 2m}
  - {name: m_max_2m, kind: aggregate, entity: merchant, op: max, field: amount, window: 2m, default: 0}
"""


def feature_settings(**overrides: Any) -> FeatureSettings:
    """Test settings: loopback, no metrics port, a budget generous enough for a loaded 2-core machine."""
    base: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "metrics_port": 0, "lookup_budget_ms": 2000.0}
    return FeatureSettings(**{**base, **overrides})


def fraud_row(**overrides: Any) -> dict[str, Any]:
    """A complete fraud_v1 row."""
    row = {
        "event_time": T0,
        "user_id": "u1",
        "merchant_id": "m1",
        "device_id": "d1",
        "amount": 120.5,
        "country": "us",
        "channel": "web",
        "mcc": "5411",
        "card_present": True,
        "account_age_days": 400.0,
    }
    return {**row, **overrides}


def cache_settings(**overrides: Any) -> CacheSettings:
    """Test settings: loopback, no metrics port, a budget generous enough for a loaded 2-core machine."""
    base: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": 0,
        "metrics_port": 0,
        "lookup_budget_ms": 1000.0,
        "store_timeout_ms": 2000.0,
        "circuit_failures": 3,
        "circuit_probe_interval_s": 0.1,
    }
    return CacheSettings(**{**base, **overrides})
