"""bench.chaos.feature_state's counting: acknowledged events lost, aggregates changed, rows marked, the checks they
become on a phase, and where the probe finds the feature service."""

from __future__ import annotations

import numpy as np
import pytest

from bench.chaos.faults import FaultError
from bench.chaos.feature_state import (
    RESET,
    StoreVerdict,
    changed_rows,
    feature_target,
    lost_events,
    marked_rows,
)
from bench.chaos.phases import WIPE, Figures, Phase, checks


def test_an_acknowledged_event_is_lost_when_its_entity_does_not_count_it() -> None:
    counts = {0: 1.0, 1: 0.0, 2: 1.0000001, 4: 0.0}
    assert lost_events([0, 1, 2, 3], counts) == [1, 3]  # 3: no row at all
    assert lost_events([], counts) == []
    assert lost_events([0, 2], counts) == []  # 4 was never acknowledged: it may be missing


def test_rows_changed_beyond_float_noise() -> None:
    before = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]])
    after = before.copy()
    after[0, 1] += 1e-9
    assert changed_rows(before, after) == 0
    after[1, 0] = 0.0
    after[2, 1] = 31.0
    assert changed_rows(before, after) == 2
    assert changed_rows(before, after[:2]) == 3  # a row gone is a change


def test_rows_marked_count_only_the_reset_reason() -> None:
    assert marked_rows([RESET, "", RESET, "other"]) == 2
    assert marked_rows([]) == 0


def test_a_crash_passes_only_with_nothing_lost_and_nothing_changed() -> None:
    ok = StoreVerdict(acknowledged=300, acknowledged_before=200, unanswered=7)
    assert [(c.label, c.ok) for c in ok.checks(wiped=False)] == [
        ("0 acknowledged lost", True),
        ("aggregates as before", True),
    ]
    bad = StoreVerdict(acknowledged=300, acknowledged_before=200, lost=[5, 9], changed=3)
    assert [(c.ok, c.measured) for c in bad.checks(wiped=False)] == [(False, "2 of 300"), (False, "3 of 200 changed")]
    assert "2 acknowledged lost" in bad.describe(False)


def test_a_wipe_passes_only_when_every_row_is_marked() -> None:
    assert StoreVerdict(rows=40, marked=40).checks(wiped=True)[0].ok
    (partly,) = StoreVerdict(rows=40, marked=39).checks(wiped=True)
    assert (partly.ok, partly.measured) == (False, "39 of 40")
    assert not StoreVerdict(rows=0, marked=0).checks(wiped=True)[0].ok  # nothing read proves nothing
    (failed,) = StoreVerdict(error="the feature store did not answer within 15 s").checks(wiped=False)
    assert not failed.ok and "did not answer" in failed.measured


def test_a_wipe_phase_is_not_asked_to_recover() -> None:
    phase = Phase("flushall valkey", 0.5, 10.0, 0.0, 20.0, WIPE, 3.0, 6.0, ("features_",))
    figures = Figures(sent=10, whole=2, degraded={RESET: 8})
    labels = {c.label: c.ok for c in checks(phase, figures, figures, None, None)}
    assert "recovered within 10 s" not in labels
    assert labels["degraded only features_*"] is True


def test_the_feature_service_is_its_socket_or_its_port() -> None:
    assert feature_target({"sockets": "/run/s", "services": []}) == "unix:/run/s/feature.sock"
    assert feature_target({"services": [{"name": "feature", "address": "127.0.0.1:8002"}]}) == "127.0.0.1:8002"
    with pytest.raises(FaultError):
        feature_target({"services": [{"name": "cache", "address": "127.0.0.1:8003"}]})
