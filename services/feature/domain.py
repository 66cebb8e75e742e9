"""The feature service's domain types: rows of typed fields in, feature matrices out; what its handler computes and
what its client (`FeatureClient`) gives other services. Other services import this: nothing here needs Redis or
protobuf."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

FieldValue = str | int | float | bool  # one typed field of a row
Row = Mapping[str, FieldValue | None]  # a row or an event as the handler takes it (None: a field without a value)


@dataclass
class Features:
    """A computed batch: (rows, columns) FP32 and per-row flags."""

    matrix: np.ndarray
    defaulted: np.ndarray
    degraded: np.ndarray
    # (rows, aggregates) where the store gave a value FP32 cannot hold (its row took defaults), None: nowhere
    nonfinite: np.ndarray | None = None
    # rows degraded because the store lost its data within their windows (features_store_reset), None: none
    reset: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class FeatureMatrix:
    """A computed batch: `features` is FP32 little-endian, row-major (rows x columns)."""

    features: bytes
    rows: int
    columns: int
    feature_names: list[str]
    degraded_rows: int  # rows whose aggregates took their defaults because the online store failed (or lost data)
    row_degraded: tuple[bool, ...] = ()  # which rows those are (empty: none is)
    # per row, why it is degraded: "" (the store failed, or not degraded) or "features_store_reset" (empty: all "")
    row_reasons: tuple[str, ...] = ()

    @property
    def degraded_reason(self) -> str:
        """The reason of the first degraded row that has one ("" when none has)."""
        return next((r for r in self.row_reasons if r), "")


@dataclass(frozen=True, slots=True)
class FeatureSetInfo:
    """What a feature set takes (input field -> type) and produces (feature names, in column order)."""

    feature_set: str
    name: str
    version: int
    inputs: dict[str, str]
    features: list[str]
    timestamp_field: str
