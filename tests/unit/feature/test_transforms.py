"""The vectorised request transforms, on whole numpy columns."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

from services.feature import transforms as tf
from tests.helpers.fixtures import T0


def test_cyclic_positions_in_day_and_week() -> None:
    ts = np.array([0, 6 * 3600, T0])
    sin, cos = tf.cyclic(ts, "hour_of_day")
    assert sin[:2] == pytest.approx([0.0, 1.0]) and cos[:2] == pytest.approx([1.0, 0.0], abs=1e-12)
    monday = np.array([4 * 86400])  # 1970-01-05, a Monday, 00:00 UTC: the start of the weekly cycle
    sin, cos = tf.cyclic(monday, "day_of_week")
    assert (sin[0], cos[0]) == pytest.approx((0.0, 1.0), abs=1e-12)


def test_one_hot_hashed_and_keys() -> None:
    values = np.array(["red", "blue", "green", "red"], dtype=object)
    assert tf.one_hot(values, ["red", "blue"], other=True).tolist() == [[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0, 0]]
    assert tf.one_hot(values, ["red", "blue"], other=False)[2].tolist() == [0, 0]
    assert tf.as_keys(np.array([True, False])).tolist() == ["true", "false"]
    assert tf.as_keys(np.array([7, -1])).tolist() == ["7", "-1"]
    hashed = tf.hashed(values, 8)
    assert hashed.sum(axis=1).tolist() == [1, 1, 1, 1]
    assert int(np.argmax(hashed[0])) == zlib.crc32(b"red") % 8 == tf.stable_hash("red", 8)


def test_numeric_transforms() -> None:
    assert tf.log1p_pos(np.array([-3.0, 0.0, math.e - 1])).tolist() == pytest.approx([0.0, 0.0, 1.0])
    assert tf.zscore(np.array([3.0]), 1.0, 2.0).tolist() == [1.0]
    values, zero = tf.ratio(np.array([1.0, 2.0]), np.array([4.0, 0.0]), -1.0)
    assert values.tolist() == [0.25, -1.0] and zero.tolist() == [False, True]
    found, missing = tf.lookup(np.array(["us", "zz"], dtype=object), {"us": 0.1}, 0.5)
    assert found.tolist() == [0.1, 0.5] and missing.tolist() == [False, True]
