"""The feature service's bounds on values and on what its messages echo: the FP32 range features travel in, and
request text cut to a short prefix (with its length) before it goes into an error message."""

from __future__ import annotations

import sys

import numpy as np

FP32_MAX = float(np.finfo(np.float32).max)  # about 3.4e38: every feature column is sent as FP32
DOUBLE_MAX = sys.float_info.max  # the store keeps bucket records as doubles
SHOWN_CHARS = 64  # of a name from the request (a feature set, a field) in an error message
SHOWN_VALUE_CHARS = 16  # of a refused value's text


def fits_fp32(x: np.ndarray) -> np.ndarray:
    """True where x is a number FP32 holds (|x| <= FP32_MAX); NaN and +-Inf do not fit."""
    with np.errstate(invalid="ignore"):
        return np.abs(x) <= FP32_MAX


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """`text` quoted for an error message: whole when short, else its first `limit` characters and its length."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"
