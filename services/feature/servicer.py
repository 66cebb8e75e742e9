"""The FeatureService gRPC servicer: protobuf in, one FeatureHandler call, protobuf out."""

from __future__ import annotations

from collections.abc import Iterable

import grpc

from services.feature.featureset import Scalar
from services.feature.handler import FeatureHandler
from services.protos import feature_pb2 as pb
from services.protos import feature_pb2_grpc as pb_grpc

SERVICE_NAME = "meshserve.feature.FeatureService"


def rows_from_pb(rows: Iterable[pb.Row]) -> list[dict[str, Scalar | None]]:
    """Typed Python values per field (None where a Value has no kind set)."""
    out = []
    for row in rows:
        fields: dict[str, Scalar | None] = {}
        for name, value in row.fields.items():
            kind = value.WhichOneof("kind")
            fields[name] = None if kind is None else getattr(value, kind)
        out.append(fields)
    return out


def value_to_pb(value: Scalar) -> pb.Value:
    """The inverse, for clients and tests."""
    if isinstance(value, bool):
        return pb.Value(bool_value=value)
    if isinstance(value, int):
        return pb.Value(int64_value=value)
    if isinstance(value, float):
        return pb.Value(double_value=value)
    return pb.Value(string_value=value)


def row_to_pb(row: dict[str, Scalar]) -> pb.Row:
    return pb.Row(fields={k: value_to_pb(v) for k, v in row.items()})


class FeatureServicer(pb_grpc.FeatureServiceServicer):
    def __init__(self, handler: FeatureHandler) -> None:
        self.handler = handler

    async def Compute(self, request: pb.ComputeRequest, context: grpc.aio.ServicerContext) -> pb.ComputeResponse:
        result = await self.handler.compute(request.feature_set, rows_from_pb(request.rows), request.budget_ms)
        fs = self.handler.feature_set(request.feature_set)
        rows, cols = result.matrix.shape
        flags = [pb.RowFlags(defaulted=d, degraded=g)
                 for d, g in zip(result.defaulted.tolist(), result.degraded.tolist(), strict=True)]  # fmt: skip
        return pb.ComputeResponse(feature_set=fs.id, rows=rows, columns=cols, feature_names=fs.names,
                                  features=result.matrix.astype("<f4", copy=False).tobytes(), flags=flags)  # fmt: skip

    async def Ingest(self, request: pb.IngestRequest, context: grpc.aio.ServicerContext) -> pb.IngestResponse:
        return pb.IngestResponse(ingested=await self.handler.ingest(request.feature_set, rows_from_pb(request.events)))

    async def GetFeatureSet(self, request: pb.GetFeatureSetRequest, context: grpc.aio.ServicerContext):
        fs = self.handler.feature_set(request.feature_set)
        spec = fs.spec
        return pb.GetFeatureSetResponse(
            feature_set=fs.id, name=spec.name, version=spec.version, timestamp_field=spec.timestamp_field,
            inputs=[pb.InputField(name=n, type=t) for n, t in spec.inputs.items()],
            features=[pb.FeatureInfo(name=n, dtype="FP32", group=g) for n, g in zip(fs.names, fs.groups, strict=True)],
        )  # fmt: skip
