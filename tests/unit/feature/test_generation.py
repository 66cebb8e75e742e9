"""The generation marker's pure parts: its encoding, the decisions of GenerationWatch, how far back a feature set
reads (lookback_s) and which rows a loss of the store marks (reset_rows); the reason on the wire."""

from __future__ import annotations

import numpy as np

from services.feature import converters
from services.feature.domain import FeatureMatrix, Features
from services.feature.featureset import load_feature_sets
from services.feature.settings import ROOT
from services.feature.store.generation import (
    RESET_REASON,
    Generation,
    GenerationWatch,
    Loss,
    lookback_s,
    reset_rows,
)
from services.gateway.joins import split_matrix
from tests.unit.feature.specs import agg_plan

NOW = 1_800_000_000.0


def test_a_marker_reads_back_as_written_and_a_foreign_one_names_a_generation() -> None:
    g = Generation.new(NOW, reset_at=NOW - 5)
    assert Generation.decode(g.encode()) == g
    assert Generation.decode(g.encode().encode()) == g  # as Redis gives it back: bytes
    assert Generation.decode(None) is None
    assert Generation.decode(b"not json") == Generation("not json", 0.0, 0.0)
    assert Generation.new(NOW).id != Generation.new(NOW).id


def test_the_first_look_at_an_empty_store_writes_a_generation_without_a_loss() -> None:
    watch = GenerationWatch()
    first = watch.seen(None, NOW)
    assert first is not None and first.reset_at == 0.0 and first.started_at == NOW
    assert watch.written(first) is None
    assert watch.current == first and watch.reset_at == 0.0 and watch.losses == []
    assert watch.seen(first, NOW + 1) is None  # the same marker again: nothing to do


def test_a_marker_gone_after_one_was_seen_is_a_loss_at_that_moment() -> None:
    watch = GenerationWatch()
    watch.written(Generation.new(NOW))
    after = watch.seen(None, NOW + 60)
    assert after is not None and after.reset_at == NOW + 60
    assert watch.written(after) == Loss(NOW + 60, noticed_here=True)
    assert watch.reset_at == NOW + 60 and watch.losses == [Loss(NOW + 60, noticed_here=True)]


def test_a_marker_another_replica_wrote_after_a_loss_is_adopted_and_reported() -> None:
    watch = GenerationWatch()
    old = Generation.new(NOW)
    watch.seen(old, NOW)  # adopted on first sight: no loss (nothing was known before)
    assert watch.current == old and watch.losses == []
    theirs = Generation.new(NOW + 30, reset_at=NOW + 29)
    assert watch.seen(theirs, NOW + 31) is None
    assert watch.current == theirs and watch.reset_at == NOW + 29
    assert watch.losses == [Loss(NOW + 29, noticed_here=False)]


def test_a_new_process_adopts_a_recent_loss_so_its_rows_are_marked_too() -> None:
    watch = GenerationWatch()
    watch.seen(Generation.new(NOW, reset_at=NOW - 10), NOW)
    assert watch.reset_at == NOW - 10 and watch.losses == []


def test_lookback_is_the_longest_window_and_its_bucket_or_the_since_last_ttl() -> None:
    assert lookback_s([(600, 60), (86400, 3600)], 0) == 90000
    assert lookback_s([(600, 60)], 7 * 86400) == 7 * 86400
    assert lookback_s([], 0) == 0
    fraud = load_feature_sets(ROOT / "features")["fraud_v1"]
    assert fraud.plan.lookback_s == 7 * 86400 + 6 * 3600  # user_count_7d over 6 h buckets
    assert agg_plan().lookback_s > 0


def test_rows_whose_windows_reach_back_before_the_loss_are_marked() -> None:
    ts = np.array([NOW - 10_000, NOW, NOW + 99, NOW + 100, NOW + 500], dtype=np.int64)
    assert reset_rows(ts, NOW, 100).tolist() == [True, True, True, False, False]
    assert not reset_rows(ts, 0.0, 100).any()  # no loss known
    assert not reset_rows(ts, NOW, 0).any()  # a feature set without aggregates


def test_the_reason_travels_per_row_to_the_gateway() -> None:
    fs = load_feature_sets(ROOT / "features")["fraud_v1"]
    matrix = np.zeros((3, 64), dtype=np.float32)
    result = Features(matrix, np.zeros(3, bool), np.array([True, True, False]), reset=np.array([False, True, False]))
    reply = converters.compute_response_to_pb(fs, result)
    assert [(f.degraded, f.reason) for f in reply.flags] == [(True, ""), (True, RESET_REASON), (False, "")]
    got = FeatureMatrix(b"\0" * 12 * 4, 3, 4, list("abcd"), 2, (True, True, False), ("", RESET_REASON, ""))
    first, second = split_matrix(got, [1, 2])
    assert (first.degraded_reason, second.degraded_reason) == ("", RESET_REASON)
    assert second.row_reasons == (RESET_REASON, "") and second.degraded_rows == 1
