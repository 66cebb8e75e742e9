"""The FP32 bounds features travel in: what fits and what does not (NaN, Inf, beyond FP32's largest finite)."""

from __future__ import annotations

import numpy as np

from services.feature.bounds import FP32_MAX, fits_fp32


def test_fits_fp32_holds_every_fp32_number_and_nothing_else() -> None:
    values = np.array([0.0, -FP32_MAX, FP32_MAX, 1e39, -1e39, np.inf, -np.inf, np.nan])
    assert fits_fp32(values).tolist() == [True, True, True, False, False, False, False, False]
    assert np.isfinite(np.float32(FP32_MAX))
