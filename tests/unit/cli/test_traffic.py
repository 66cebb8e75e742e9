"""The synthetic transaction generator: fields and types of the fraud pipeline, determinism, repeats."""

from __future__ import annotations

from collections import Counter

import pytest

from services.cli.traffic import CHANNELS, FIELDS, TrafficGenerator


def test_rows_carry_every_fraud_field_with_its_type() -> None:
    gen = TrafficGenerator(seed=1, clock=lambda: 1_700_000_000.7)
    for row in gen.batch(200):
        assert tuple(row) == FIELDS
        assert row["event_time"] == 1_700_000_000
        assert isinstance(row["amount"], float) and row["amount"] > 0
        assert row["channel"] in CHANNELS
        assert row["card_present"] == (row["channel"] == "pos")
        assert all(isinstance(row[k], str) for k in ("user_id", "merchant_id", "device_id", "country", "mcc"))
        assert 1 <= row["account_age_days"] <= 3650


def test_same_seed_same_stream() -> None:
    clock = lambda: 1_700_000_000.0  # noqa: E731
    assert TrafficGenerator(seed=7, clock=clock).batch(50) == TrafficGenerator(seed=7, clock=clock).batch(50)
    assert TrafficGenerator(seed=7, clock=clock).batch(50) != TrafficGenerator(seed=8, clock=clock).batch(50)


@pytest.mark.parametrize("repeat", [0.0, 0.3, 0.7])
def test_repeat_rate_and_zipf_popularity(repeat: float) -> None:
    gen = TrafficGenerator(seed=3, repeat=repeat)
    rows = gen.batch(5000)
    assert gen.repeats / gen.sent == pytest.approx(repeat, abs=0.03)
    counts = Counter(tuple(sorted(r.items())) for r in rows)
    duplicates = len(rows) - len(counts)
    if repeat == 0:
        assert duplicates <= 5  # new transactions collide only by chance
    else:
        assert duplicates >= 0.9 * gen.repeats
        top = counts.most_common(1)[0][1]
        assert top > 10 * (len(rows) / len(counts))  # a few rows are re-sent far more often than the average


def test_suspicious_share_brings_far_countries_and_fraud_devices() -> None:
    rows = TrafficGenerator(seed=2, repeat=0.0, suspicious=1.0).batch(300)
    assert sum(r["device_id"].startswith("fd") for r in rows) > 150
    assert sum(r["country"] in {"ng", "ru", "ua", "cn", "id", "in", "vn", "ro"} for r in rows) > 100
    assert TrafficGenerator(seed=2, repeat=0.0, suspicious=0.0).batch(300)[0]["device_id"].startswith("d")


def test_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        TrafficGenerator(repeat=1.5)
    with pytest.raises(ValueError):
        TrafficGenerator(zipf_a=1.0)
