"""The FeatureService gRPC servicer: protobuf in, one FeatureHandler call, protobuf out (converters.py); Ingest
after the operator check."""

from __future__ import annotations

import grpc

from services.common.operator_check import OPEN, OperatorCheck
from services.feature import converters
from services.feature.handler import FeatureHandler
from services.protos import feature_pb2 as pb
from services.protos import feature_pb2_grpc as pb_grpc

SERVICE_NAME = "meshserve.feature.FeatureService"
OPERATOR_RPCS = ("Ingest",)
"""The RPCs that write the online aggregates every later answer reads: only the operator may call them."""


class FeatureServicer(pb_grpc.FeatureServiceServicer):
    """`operator` guards OPERATOR_RPCS (default: open to every caller)."""

    def __init__(self, handler: FeatureHandler, operator: OperatorCheck = OPEN) -> None:
        self.handler = handler
        self.operator = operator

    async def Compute(self, request: pb.ComputeRequest, context: grpc.aio.ServicerContext) -> pb.ComputeResponse:
        rows = converters.rows_from_pb(request.rows)
        result = await self.handler.compute(request.feature_set, rows, request.budget_ms)
        return converters.compute_response_to_pb(self.handler.feature_set(request.feature_set), result)

    async def Ingest(self, request: pb.IngestRequest, context: grpc.aio.ServicerContext) -> pb.IngestResponse:
        self.operator.require(context, "Ingest")
        ingested = await self.handler.ingest(request.feature_set, converters.rows_from_pb(request.events))
        return converters.ingest_response_to_pb(ingested)

    async def GetFeatureSet(
        self, request: pb.GetFeatureSetRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetFeatureSetResponse:
        return converters.feature_set_to_pb(self.handler.feature_set(request.feature_set))
