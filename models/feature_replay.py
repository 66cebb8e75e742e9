"""Point-in-time training features: replay an event stream in time order through the feature service's own code.

Each event's features are what `FeatureHandler.compute` returns for it against a store that holds every
earlier event of the stream and nothing later, i.e. what serving returns for that event when it arrives.
The store's aggregates read only events strictly before a row's time (windows: whole buckets before the
row's bucket; since_last: earlier seconds), so events at the row's own second may be present or not.
The stream is cut into chunks whose events do not depend on one another (no entity id of an event
appears in the same chunk at an earlier second); a chunk is computed, then ingested, then the next one.
Compute-before-ingest means nothing later than a chunk is ever in the store while it is computed (so
pruning and the last-seen cap act exactly as they do online), and the chunk cut means nothing earlier
is missing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from services.common.embedded import EmbeddedValkey
from services.feature.handler import FeatureHandler
from services.feature.settings import ROOT, FeatureSettings

FEATURES_DIR = ROOT / "features"
KEY_PREFIX = "meshserve:replay:"


def replay_settings(features_dir: Path = FEATURES_DIR) -> FeatureSettings:
    """Service settings for an offline replay: no ports, and a lookup budget no loaded machine misses."""
    return FeatureSettings(
        features_dir=features_dir,
        port=0,
        metrics_port=0,
        key_prefix=KEY_PREFIX,
        lookup_budget_ms=120_000.0,
        ingest_timeout_ms=120_000.0,
    )


def independent_chunks(
    rows: Sequence[Mapping[str, Any]], ts_field: str, entity_fields: Sequence[str], max_rows: int
) -> Iterator[tuple[int, int]]:
    """[start, end) ranges of time-sorted rows, cut before a row that shares an entity id with an earlier
    second of its chunk (so no row of a chunk depends on another) and at most max_rows long."""
    start = 0
    seen: dict[tuple[str, Any], int] = {}  # (entity field, id) -> its time in the current chunk
    previous = None
    for i, row in enumerate(rows):
        t = row[ts_field]
        if previous is not None and t < previous:
            raise ValueError(f"rows are not sorted by {ts_field}: row {i} ({t}) comes after {previous}")
        previous = t
        keys = [(f, row[f]) for f in entity_fields]
        if i - start >= max_rows or any(seen.get(k, t) < t for k in keys):
            yield start, i
            start = i
            seen = {}
        for k in keys:
            seen[k] = t
    if start < len(rows):
        yield start, len(rows)


async def replay(
    handler: FeatureHandler, set_id: str, rows: Sequence[Mapping[str, Any]], compute_from: int = 0
) -> np.ndarray:
    """Ingest time-sorted rows in order, computing the features of rows[compute_from:] as of each row.

    Returns (len(rows) - compute_from, columns) FP32. Raises RuntimeError if the store degraded any row
    (a default taken because the store failed would be training/serving skew).
    """
    fs = handler.feature_set(set_id)
    ts_field = fs.spec.timestamp_field
    max_rows = handler.settings.max_batch
    for start in range(0, compute_from, max_rows):  # history only: no features needed, ingest in big batches
        await handler.ingest(set_id, rows[start : min(start + max_rows, compute_from)])
    out = np.empty((len(rows) - compute_from, len(fs.names)), dtype=np.float32)
    entity_fields = sorted(set(fs.spec.entities.values()))
    tail = rows[compute_from:]
    for start, end in independent_chunks(tail, ts_field, entity_fields, max_rows):
        chunk = tail[start:end]
        result = await handler.compute(set_id, chunk)
        if result.degraded.any():
            raise RuntimeError(f"online store degraded {int(result.degraded.sum())} rows during replay")
        out[start:end] = result.matrix
        await handler.ingest(set_id, chunk)
    return out


async def _replay_embedded(
    set_id: str, rows: Sequence[Mapping[str, Any]], compute_from: int, features_dir: Path
) -> np.ndarray:
    valkey = EmbeddedValkey()
    await valkey.start()
    try:
        handler = FeatureHandler(replay_settings(features_dir), valkey.url)
        try:
            return await replay(handler, set_id, rows, compute_from)
        finally:
            await handler.close()
    finally:
        await valkey.stop()


def replay_features(
    set_id: str, rows: Sequence[Mapping[str, Any]], compute_from: int = 0, features_dir: Path = FEATURES_DIR
) -> np.ndarray:
    """`replay` on a fresh embedded Valkey (synchronous; for training and tools)."""
    return asyncio.run(_replay_embedded(set_id, rows, compute_from, features_dir))
