"""The feature service's public surface: what another service may import from it (the gateway does).

`FeatureClient`, which computes feature matrices and raises the project's errors, the plain types it speaks, and
`to_row` (a row of typed fields as the service takes it). Nothing here imports Redis or the service's internals.
"""

from __future__ import annotations

from services.feature.client import FeatureClient, to_row
from services.feature.domain import FeatureMatrix, FeatureSetInfo, FieldValue

__all__ = ["FeatureClient", "FeatureMatrix", "FeatureSetInfo", "FieldValue", "to_row"]
