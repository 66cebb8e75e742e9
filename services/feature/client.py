"""The feature service's client: computes feature matrices over gRPC and raises the project's errors.

Rows of typed fields in, an FP32 matrix out (services.feature.domain). Every failed call raises a `MeshserveError`
carrying the feature service's status code. Nothing here imports Redis or the service's internals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import grpc

from services.common.errors import InvalidArgument, from_rpc_error
from services.feature.domain import FeatureMatrix, FeatureSetInfo, FieldValue
from services.protos import feature_pb2 as pb
from services.protos import feature_pb2_grpc as pb_grpc

Metadata = Sequence[tuple[str, str]]
SERVICE = "feature service"


def _set_value(value: pb.Value, field: str, item: FieldValue) -> None:
    # bool before int: a bool is an int to isinstance
    if isinstance(item, bool):
        value.bool_value = item
    elif isinstance(item, int):
        value.int64_value = item
    elif isinstance(item, float):
        value.double_value = item
    elif isinstance(item, str):
        value.string_value = item
    else:
        raise InvalidArgument(f"field {field!r}: {type(item).__name__} is not a feature value")


def to_row(fields: Mapping[str, FieldValue]) -> pb.Row:
    """One row of typed fields as the feature service takes it (str, int, float, bool)."""
    row = pb.Row()
    for name, item in fields.items():
        _set_value(row.fields[name], name, item)
    return row


class FeatureClient:
    """The FeatureService (or its mesh listener) over one channel."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self.stub = pb_grpc.FeatureServiceStub(channel)

    async def compute(
        self,
        feature_set: str,
        rows: Sequence[Mapping[str, FieldValue]],
        budget_ms: float = 0.0,
        *,
        timeout_s: float | None = None,
        metadata: Metadata = (),
    ) -> FeatureMatrix:
        """The feature matrix of `rows`; a degraded online store still answers (see `degraded_rows`)."""
        request = pb.ComputeRequest(feature_set=feature_set, rows=[to_row(r) for r in rows], budget_ms=budget_ms)
        try:
            response = await self.stub.Compute(request, timeout=timeout_s, metadata=tuple(metadata))
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(SERVICE, exc) from exc
        flags = tuple(f.degraded for f in response.flags)
        reasons = tuple(f.reason for f in response.flags) if any(f.reason for f in response.flags) else ()
        names = list(response.feature_names)
        return FeatureMatrix(response.features, response.rows, response.columns, names, sum(flags), flags, reasons)

    async def get_feature_set(
        self, feature_set: str, *, timeout_s: float | None = None, metadata: Metadata = ()
    ) -> FeatureSetInfo:
        request = pb.GetFeatureSetRequest(feature_set=feature_set)
        try:
            response = await self.stub.GetFeatureSet(request, timeout=timeout_s, metadata=tuple(metadata))
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(SERVICE, exc) from exc
        return FeatureSetInfo(
            response.feature_set,
            response.name,
            response.version,
            {f.name: f.type for f in response.inputs},
            [f.name for f in response.features],
            response.timestamp_field,
        )

    async def close(self) -> None:
        await self.channel.close()
