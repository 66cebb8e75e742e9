"""The scaler's two gRPC servicers: KEDA's ExternalScaler and the gateways' DemandService, protobuf in, one
ScalerHandler call, protobuf out."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from services.protos import demand_pb2 as demand_pb
from services.protos import demand_pb2_grpc as demand_grpc
from services.protos import externalscaler_pb2 as keda_pb
from services.protos import externalscaler_pb2_grpc as keda_grpc
from services.scaler import converters
from services.scaler.handler import ScalerHandler

SERVICE_NAME = "externalscaler.ExternalScaler"
DEMAND_SERVICE_NAME = "meshserve.demand.DemandService"


class ScalerServicer(keda_grpc.ExternalScalerServicer):
    """KEDA's external-scaler API; errors are the handler's domain errors (a trigger's metadata without `model` is
    INVALID_ARGUMENT), which the shared interceptor turns into gRPC status codes."""

    def __init__(self, handler: ScalerHandler) -> None:
        self.handler = handler

    async def IsActive(
        self, request: keda_pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> keda_pb.IsActiveResponse:
        return converters.active_to_pb(self.handler.is_active(converters.metadata_from_pb(request)))

    async def StreamIsActive(
        self, request: keda_pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[keda_pb.IsActiveResponse]:
        async for active in self.handler.watch_active(converters.metadata_from_pb(request)):
            yield converters.active_to_pb(active)

    async def GetMetricSpec(
        self, request: keda_pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> keda_pb.GetMetricSpecResponse:
        return converters.specs_to_pb(self.handler.metric_spec(converters.metadata_from_pb(request)))

    async def GetMetrics(
        self, request: keda_pb.GetMetricsRequest, context: grpc.aio.ServicerContext
    ) -> keda_pb.GetMetricsResponse:
        metadata = converters.metadata_from_pb(request.scaledObjectRef)
        return converters.values_to_pb(self.handler.metrics(metadata, request.metricName))


class DemandServicer(demand_grpc.DemandServiceServicer):
    """The gateways' report streams, handed to the handler as snapshots."""

    def __init__(self, handler: ScalerHandler) -> None:
        self.handler = handler

    async def Report(
        self, request_iterator: AsyncIterator[demand_pb.DemandReport], context: grpc.aio.ServicerContext
    ) -> demand_pb.ReportAck:
        return converters.ack_to_pb(await self.handler.report(converters.snapshots_from_pb(request_iterator)))
