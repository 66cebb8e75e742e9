"""Protobuf <-> domain conversions for the FeatureService RPCs (no logic beyond the mapping)."""

from __future__ import annotations

from collections.abc import Iterable

from services.feature.domain import Features, FieldValue
from services.feature.featureset import FeatureSet
from services.feature.store.generation import RESET_REASON
from services.protos import feature_pb2 as pb

FEATURE_DTYPE = "FP32"  # every output column; the matrix travels as little-endian float32, row-major


def rows_from_pb(rows: Iterable[pb.Row]) -> list[dict[str, FieldValue | None]]:
    """Typed Python values per field (None where a Value has no kind set: the handler names it)."""
    out = []
    for row in rows:
        fields: dict[str, FieldValue | None] = {}
        for name, value in row.fields.items():
            kind = value.WhichOneof("kind")
            fields[name] = None if kind is None else getattr(value, kind)
        out.append(fields)
    return out


def compute_response_to_pb(fs: FeatureSet, result: Features) -> pb.ComputeResponse:
    rows, cols = result.matrix.shape
    reset = result.reset.tolist() if result.reset is not None else [False] * rows
    flags = [
        pb.RowFlags(defaulted=d, degraded=g, reason=RESET_REASON if r else "")
        for d, g, r in zip(result.defaulted.tolist(), result.degraded.tolist(), reset, strict=True)
    ]
    return pb.ComputeResponse(
        feature_set=fs.id,
        rows=rows,
        columns=cols,
        feature_names=fs.names,
        features=result.matrix.astype("<f4", copy=False).tobytes(),
        flags=flags,
    )


def ingest_response_to_pb(ingested: int) -> pb.IngestResponse:
    return pb.IngestResponse(ingested=ingested)


def feature_set_to_pb(fs: FeatureSet) -> pb.GetFeatureSetResponse:
    spec = fs.spec
    return pb.GetFeatureSetResponse(
        feature_set=fs.id,
        name=spec.name,
        version=spec.version,
        timestamp_field=spec.timestamp_field,
        inputs=[pb.InputField(name=n, type=t) for n, t in spec.inputs.items()],
        features=[
            pb.FeatureInfo(name=n, dtype=FEATURE_DTYPE, group=g) for n, g in zip(fs.names, fs.groups, strict=True)
        ],
    )
