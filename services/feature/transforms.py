"""Vectorised request transforms: each takes whole-batch numpy columns and returns whole-batch columns."""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np

DAY_S = 86400
WEEK_S = 7 * DAY_S
# 1970-01-01 was a Thursday; shifting by 3 days makes Monday 00:00 UTC the start of the weekly cycle.
_MONDAY_SHIFT_S = 3 * DAY_S


def log1p_pos(x: np.ndarray) -> np.ndarray:
    """log1p(max(x, 0)): defined for every value, monotone, 0 at 0."""
    return np.log1p(np.maximum(x, 0.0))


def zscore(x: np.ndarray, mean: float, std: float) -> np.ndarray:
    return (x - mean) / std


def cyclic(ts: np.ndarray, period: str) -> tuple[np.ndarray, np.ndarray]:
    """sin and cos of the position of unix-seconds timestamps within the UTC day or week (Monday first)."""
    if period == "hour_of_day":
        phase = np.mod(ts, DAY_S) / DAY_S
    else:
        phase = np.mod(ts + _MONDAY_SHIFT_S, WEEK_S) / WEEK_S
    angle = 2.0 * np.pi * phase
    return np.sin(angle), np.cos(angle)


def as_keys(values: np.ndarray) -> np.ndarray:
    """Categorical values (str, int or bool object array) as strings: bools as true/false, ints in decimal."""
    if values.dtype == np.bool_:
        return np.where(values, "true", "false").astype(object)
    if values.dtype.kind in "iu":
        return values.astype(str).astype(object)
    return values


def _codes(values: np.ndarray, code_of: dict[str, int] | None, fn: Callable[[str], int] | None = None) -> np.ndarray:
    """Map each value to an int code (by code_of, -1 where absent, else by fn), computing the mapping once per
    distinct value (np.unique), not per row."""
    uniques, inverse = np.unique(as_keys(values).astype(str), return_inverse=True)
    if code_of is not None:
        mapped = np.array([code_of.get(u, -1) for u in uniques.tolist()], dtype=np.int64)
    else:
        assert fn is not None
        mapped = np.array([fn(u) for u in uniques.tolist()], dtype=np.int64)
    return mapped[inverse.reshape(-1)]


def one_hot(values: np.ndarray, categories: list[str], other: bool) -> np.ndarray:
    """(rows, len(categories) [+1 for other]) of 0/1."""
    codes = _codes(values, {c: i for i, c in enumerate(categories)})
    width = len(categories) + (1 if other else 0)
    if other:
        codes = np.where(codes < 0, len(categories), codes)
    out = np.zeros((len(values), width), dtype=np.float32)
    hit = codes >= 0
    out[np.nonzero(hit)[0], codes[hit]] = 1.0
    return out


def stable_hash(text: str, buckets: int) -> int:
    """CRC32 of the UTF-8 text modulo buckets: the same in every process and in training."""
    return zlib.crc32(text.encode()) % buckets


def hashed(values: np.ndarray, buckets: int) -> np.ndarray:
    """One-hot over `buckets` columns by stable hash (the hashing trick)."""
    codes = _codes(values, None, lambda u: stable_hash(u, buckets))
    out = np.zeros((len(values), buckets), dtype=np.float32)
    out[np.arange(len(values)), codes] = 1.0
    return out


def lookup(values: np.ndarray, table: dict[str, float], default: float) -> tuple[np.ndarray, np.ndarray]:
    """Table values by key; (values, missing mask) with `default` where the key is absent."""
    uniques, inverse = np.unique(as_keys(values).astype(str), return_inverse=True)
    found = np.array([table.get(u, np.nan) for u in uniques.tolist()], dtype=np.float64)[inverse.reshape(-1)]
    missing = np.isnan(found)
    return np.where(missing, default, found), missing


def ratio(num: np.ndarray, den: np.ndarray, default: float) -> tuple[np.ndarray, np.ndarray]:
    """num / den, `default` where den is 0; (values, defaulted mask)."""
    zero = den == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(zero, default, num / np.where(zero, 1.0, den))
    return out, zero
