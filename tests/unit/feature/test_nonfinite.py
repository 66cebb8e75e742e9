"""A non-finite aggregate coming out of the store is the store's failure: the row's aggregates take their
declared defaults and the row is degraded (the call succeeds), with a metric and a rate-limited log line naming
the feature and the entity. Other rows of the batch keep their values."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from services.feature import metrics
from services.feature.featureset import FeatureSet, load_feature_sets
from services.feature.handler import FeatureHandler
from services.feature.spec import Aggregate
from services.feature.store import AggregateResult
from tests.helpers.fixtures import AGG_YAML

Make = Callable[..., FeatureHandler]
FP32_MAX = float(np.finfo(np.float32).max)
T = 1_700_000_000


def counter(metric: object, *labels: str) -> float:
    return float(metric.labels(*labels)._value.get())  # type: ignore[attr-defined]


def agg_set(tmp_path: Path) -> FeatureSet:
    (tmp_path / "agg_v1.yaml").write_text(AGG_YAML)
    return load_feature_sets(tmp_path)["agg_v1"]


def rows(n: int) -> list[dict[str, object]]:
    return [{"ts": T, "user": f"u{i}", "merchant": "m", "amount": 2.0} for i in range(n)]


def online(fs: FeatureSet, n: int, poison: dict[tuple[int, str], float]) -> AggregateResult:
    """Every aggregate 3.0 for every row, but `poison` (row, feature name) -> value."""
    values = {i: np.full(n, 3.0) for i, f in enumerate(fs.spec.features) if isinstance(f, Aggregate)}
    for (r, name), v in poison.items():
        values[fs.names.index(name)][r] = v
    return AggregateResult(values, np.zeros(n, dtype=bool))


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 1e39])
def test_a_non_finite_aggregate_degrades_its_row_only(tmp_path: Path, bad: float) -> None:
    """1e39 is a finite double but no FP32: as the issue's poisoned merchant mean was."""
    fs = agg_set(tmp_path)
    columns = fs.columns(rows(3))
    result = fs.compute(columns, online(fs, 3, {(1, "u_mean_5m"): bad}))
    assert np.isfinite(result.matrix).all()
    assert result.degraded.tolist() == [False, True, False]
    assert result.defaulted.tolist() == [False, True, False]
    defaults = {f.name: f.default for f in fs.spec.features if isinstance(f, Aggregate)}
    assert {n: float(result.matrix[1, fs.names.index(n)]) for n in defaults} == defaults  # every aggregate
    assert result.matrix[0, fs.names.index("u_mean_5m")] == 3.0 == result.matrix[2, fs.names.index("u_count_1m")]
    assert result.nonfinite is not None and np.argwhere(result.nonfinite).tolist() == [
        [1, fs.aggregate_names.index("u_mean_5m")]
    ]


def test_finite_aggregates_report_nothing(tmp_path: Path) -> None:
    fs = agg_set(tmp_path)
    result = fs.compute(fs.columns(rows(2)), online(fs, 2, {(0, "u_sum_5m"): FP32_MAX}))
    assert not result.degraded.any() and result.nonfinite is None


async def test_the_handler_counts_and_logs_it_rate_limited(
    make_offline_handler: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "agg_v1.yaml").write_text(AGG_YAML)
    handler = make_offline_handler(tmp_path)
    fs = handler.feature_set("agg_v1")

    async def poisoned_read(*args: object, **kwargs: object) -> AggregateResult:
        return online(fs, 4, {(2, "m_max_2m"): math.inf, (3, "u_sum_5m"): math.nan})

    monkeypatch.setattr(handler.store, "read", poisoned_read)
    before = counter(metrics.NONFINITE, "agg_v1", "m_max_2m"), counter(metrics.DEGRADED_ROWS, "agg_v1")
    caplog.set_level(logging.WARNING, logger="services.feature.handler")
    for _ in range(3):
        result = await handler.compute("agg_v1", rows(4))
        assert result.degraded.tolist() == [False, False, True, True] and np.isfinite(result.matrix).all()
    after = counter(metrics.NONFINITE, "agg_v1", "m_max_2m"), counter(metrics.DEGRADED_ROWS, "agg_v1")
    assert after == (before[0] + 3, before[1] + 6)
    lines = [r.getMessage() for r in caplog.records if "non-finite" in r.getMessage()]
    assert len(lines) == 1, lines  # one line per interval, however many calls
    assert "agg_v1" in lines[0] and "m_max_2m" in lines[0] and "merchant 'm'" in lines[0], lines[0]
