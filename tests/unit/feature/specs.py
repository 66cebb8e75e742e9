"""Feature set specs for in-process tests of the store's plan compiler and decoder."""

from __future__ import annotations

import yaml

from services.feature.spec import FeatureSetSpec
from services.feature.store import AggregatePlan

# Two entities; user has bucket groups of 10 s and 1 min (two bands of one sorted set), merchant one of 12 s.
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


def spec_of(text: str) -> FeatureSetSpec:
    return FeatureSetSpec.model_validate(yaml.safe_load(text))


def agg_plan() -> AggregatePlan:
    return AggregatePlan.of(spec_of(AGG_YAML))
