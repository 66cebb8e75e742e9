"""The feature service's bounds on values: the FP32 range features travel in, the double range the store keeps,
and how much of a refused value's text an error message shows."""

from __future__ import annotations

import sys

import numpy as np

FP32_MAX = float(np.finfo(np.float32).max)  # about 3.4e38: every feature column is sent as FP32
DOUBLE_MAX = sys.float_info.max  # the store keeps bucket records as doubles
SHOWN_VALUE_CHARS = 16  # of a refused value's text


def fits_fp32(x: np.ndarray) -> np.ndarray:
    """True where x is a number FP32 holds (|x| <= FP32_MAX); NaN and +-Inf do not fit."""
    with np.errstate(invalid="ignore"):
        return np.abs(x) <= FP32_MAX
