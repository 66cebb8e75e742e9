"""Protobuf <-> domain conversions of the scaler's two APIs, both ways (servicer and clients; pure mapping): KEDA's
external-scaler messages and the gateways' demand reports."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping, Sequence

from services.protos import demand_pb2 as demand_pb
from services.protos import externalscaler_pb2 as keda_pb
from services.scaler.domain import Demand, DemandKey, DemandSnapshot, MetricSpec, MetricValue, ReportAck

# -- KEDA's external scaler ---------------------------------------------------------------------------------


def metadata_from_pb(ref: keda_pb.ScaledObjectRef) -> dict[str, str]:
    """The trigger's metadata (the handler reads the keys it knows)."""
    return dict(ref.scalerMetadata)


def ref_to_pb(metadata: Mapping[str, str], name: str = "", namespace: str = "") -> keda_pb.ScaledObjectRef:
    return keda_pb.ScaledObjectRef(name=name, namespace=namespace, scalerMetadata=dict(metadata))


def active_to_pb(active: bool) -> keda_pb.IsActiveResponse:
    return keda_pb.IsActiveResponse(result=active)


def specs_to_pb(specs: Sequence[MetricSpec]) -> keda_pb.GetMetricSpecResponse:
    """Each target as KEDA reads it: targetSizeFloat, and the deprecated integer targetSize (at least 1) for KEDAs
    that read only that."""
    return keda_pb.GetMetricSpecResponse(
        metricSpecs=[
            keda_pb.MetricSpec(metricName=s.name, targetSize=max(1, round(s.target)), targetSizeFloat=s.target)
            for s in specs
        ]
    )


def specs_from_pb(response: keda_pb.GetMetricSpecResponse) -> list[MetricSpec]:
    """As KEDA reads them: targetSizeFloat when above 0, else targetSize."""
    return [MetricSpec(s.metricName, s.targetSizeFloat or float(s.targetSize)) for s in response.metricSpecs]


def values_to_pb(values: Sequence[MetricValue]) -> keda_pb.GetMetricsResponse:
    """Each value in both of KEDA's fields (the integer one rounded up, so a fraction never reads as idle)."""
    return keda_pb.GetMetricsResponse(
        metricValues=[
            keda_pb.MetricValue(metricName=v.name, metricValue=math.ceil(v.value), metricValueFloat=v.value)
            for v in values
        ]
    )


def values_from_pb(response: keda_pb.GetMetricsResponse) -> list[MetricValue]:
    """As KEDA reads them: metricValueFloat when above 0, else metricValue."""
    return [MetricValue(v.metricName, v.metricValueFloat or float(v.metricValue)) for v in response.metricValues]


# -- the gateways' demand reports ---------------------------------------------------------------------------


def snapshot_to_pb(snapshot: DemandSnapshot) -> demand_pb.DemandReport:
    return demand_pb.DemandReport(
        gateway=snapshot.gateway,
        demand=[
            demand_pb.ModelDemand(model=model, subset=subset, in_flight=d.in_flight, parked=d.parked)
            for (model, subset), d in sorted(snapshot.demand.items())
        ],
    )


def snapshot_from_pb(report: demand_pb.DemandReport) -> DemandSnapshot:
    """A report's snapshot; entries repeated for one model and subset add up."""
    demand: dict[DemandKey, Demand] = {}
    for entry in report.demand:
        key = (entry.model, entry.subset)
        demand[key] = demand.get(key, Demand()) + Demand(entry.in_flight, entry.parked)
    return DemandSnapshot(report.gateway, demand)


async def snapshots_from_pb(reports: AsyncIterator[demand_pb.DemandReport]) -> AsyncIterator[DemandSnapshot]:
    async for report in reports:
        yield snapshot_from_pb(report)


def ack_to_pb(ack: ReportAck) -> demand_pb.ReportAck:
    return demand_pb.ReportAck(reports=ack.reports)


def ack_from_pb(ack: demand_pb.ReportAck) -> ReportAck:
    return ReportAck(ack.reports)
