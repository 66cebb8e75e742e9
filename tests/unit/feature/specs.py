"""Feature set specs for in-process tests of the store's plan compiler and decoder."""

from __future__ import annotations

import yaml

from services.feature.spec import FeatureSetSpec
from services.feature.store import AggregatePlan
from tests.helpers.fixtures import AGG_YAML


def spec_of(text: str) -> FeatureSetSpec:
    return FeatureSetSpec.model_validate(yaml.safe_load(text))


def agg_plan() -> AggregatePlan:
    return AggregatePlan.of(spec_of(AGG_YAML))
