"""Point-in-time replay: the stream is cut into chunks whose events do not depend on one another."""

from __future__ import annotations

import pytest

from models import transactions
from models.feature_replay import independent_chunks

ENTITY_FIELDS = ["device_id", "merchant_id", "user_id"]


def test_chunks_hold_no_dependent_events() -> None:
    t0 = transactions.START
    rows = [
        {"event_time": t0, "user_id": "u1", "merchant_id": "m1", "device_id": "d1"},
        {"event_time": t0, "user_id": "u1", "merchant_id": "m2", "device_id": "d2"},  # same second: same chunk
        {"event_time": t0 + 1, "user_id": "u2", "merchant_id": "m3", "device_id": "d3"},
        {"event_time": t0 + 2, "user_id": "u3", "merchant_id": "m1", "device_id": "d4"},  # m1 earlier: cut
        {"event_time": t0 + 3, "user_id": "u4", "merchant_id": "m4", "device_id": "d5"},
        {"event_time": t0 + 4, "user_id": "u5", "merchant_id": "m5", "device_id": "d6"},
    ]
    assert list(independent_chunks(rows, "event_time", ENTITY_FIELDS, max_rows=1024)) == [(0, 3), (3, 6)]
    assert list(independent_chunks(rows, "event_time", ENTITY_FIELDS, max_rows=2)) == [(0, 2), (2, 4), (4, 6)]
    with pytest.raises(ValueError, match="not sorted"):
        list(independent_chunks(rows[::-1], "event_time", ENTITY_FIELDS, max_rows=1024))
