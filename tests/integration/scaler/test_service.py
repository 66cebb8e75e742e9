"""`python -m services.scaler` as its own process, called as KEDA calls it (GetMetricSpec, GetMetrics with the metric
name from the spec, IsActive, and StreamIsActive kept open) while gateways report demand: the generated
externalscaler stubs on one side, DemandReporter, raw report streams and a real gateway process on the other."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np

from services.protos import demand_pb2 as demand_pb
from services.protos import demand_pb2_grpc as demand_grpc
from services.protos import externalscaler_pb2 as keda_pb
from services.protos import externalscaler_pb2_grpc as keda_grpc
from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc
from services.scaler.api import Demand, DemandKey, DemandReporter
from tests.helpers.models import Mlp, mlp_config, write_model
from tests.helpers.servers import ServiceProcess, free_port, gateway_service, model_service, service_process

FLIP_WITHIN_S = 0.5  # a 2-core machine shared with other tests: the push itself takes milliseconds


def ref(scaler: ServiceProcess, **metadata: str) -> keda_pb.ScaledObjectRef:
    """A ScaledObjectRef as KEDA builds it: the ScaledObject's name and namespace, and the trigger's whole metadata
    block (scalerAddress included)."""
    return keda_pb.ScaledObjectRef(
        name="model-v2", namespace="meshserve", scalerMetadata={"scalerAddress": scaler.address, **metadata}
    )


async def metric_value(stub: keda_grpc.ExternalScalerStub, so: keda_pb.ScaledObjectRef) -> float:
    """KEDA's poll: the metric name from GetMetricSpec (KEDA names the HPA metric `s0-<name>` and strips the prefix
    again before calling GetMetrics), then GetMetrics; the value as KEDA reads it."""
    (spec,) = (await stub.GetMetricSpec(so, timeout=5)).metricSpecs
    request = keda_pb.GetMetricsRequest(scaledObjectRef=so, metricName=spec.metricName)
    (value,) = (await stub.GetMetrics(request, timeout=5)).metricValues
    assert value.metricName == spec.metricName
    return value.metricValueFloat if value.metricValueFloat > 0 else float(value.metricValue)


async def within(seconds: float, condition: Callable[[], object]) -> float:
    """Seconds until the awaitable-returning `condition()` gives a true value; AssertionError after `seconds`."""
    start = time.monotonic()
    while True:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return time.monotonic() - start
        assert time.monotonic() - start < seconds, "condition not met in time"
        await asyncio.sleep(0.01)


def scraped(service: ServiceProcess) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{service.metrics_port}/metrics", timeout=5).read().decode()


async def test_keda_reads_the_demand_and_stream_is_active_flips_at_once(tmp_path: Path) -> None:
    with service_process("scaler", tmp_path, {"MESHSERVE_SCALER_STALE_AFTER_S": "2"}) as scaler:
        demand: dict[DemandKey, Demand] = {}
        changed = asyncio.Event()
        reporter = DemandReporter(scaler.address, "gateway-1", lambda: demand, changed)
        reporting = asyncio.ensure_future(reporter.run())
        async with grpc.aio.insecure_channel(scaler.address) as channel:
            stub = keda_grpc.ExternalScalerStub(channel)
            so = ref(scaler, model="fraud_mlp", subset="v2", targetPerReplica="32")
            (spec,) = (await stub.GetMetricSpec(so, timeout=5)).metricSpecs
            assert (spec.metricName, spec.targetSize, spec.targetSizeFloat) == ("meshserve-fraud-mlp-v2", 32, 32.0)
            assert await metric_value(stub, so) == 0.0
            assert not (await stub.IsActive(so, timeout=5)).result
            stream = stub.StreamIsActive(so)  # kept open, as KEDA's external-push trigger does
            assert (await asyncio.wait_for(stream.read(), 5)).result is False

            demand[("fraud_mlp", "v2")] = Demand(in_flight=0, parked=1)  # a request parks
            changed.set()
            flip = asyncio.ensure_future(stream.read())
            seconds = await within(FLIP_WITHIN_S, flip.done)
            assert flip.result().result is True, f"flipped after {seconds:.3f} s"
            assert await metric_value(stub, so) == 1.0 and (await stub.IsActive(so, timeout=5)).result
            demand[("fraud_mlp", "v2")] = Demand(in_flight=40, parked=1)
            demand[("fraud_mlp", "v1")] = Demand(in_flight=7, parked=0)
            changed.set()
            await within(2, lambda: _equals(metric_value(stub, so), 41.0))  # 2 replicas at 32 per replica
            assert await metric_value(stub, ref(scaler, model="fraud_mlp")) == 48.0  # every subset
            metrics = scraped(scaler)
            assert 'meshserve_scaler_demand{model="fraud_mlp",state="in_flight",subset="v2"} 40.0' in metrics
            assert "meshserve_scaler_gateways 1.0" in metrics

            demand.clear()  # answered, nothing parked
            changed.set()
            flip = asyncio.ensure_future(stream.read())
            await within(FLIP_WITHIN_S, flip.done)
            assert flip.result().result is False and await metric_value(stub, so) == 0.0

            refused = stub.GetMetricSpec(ref(scaler, subset="v2"), timeout=5)
            try:
                await refused
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "no 'model'" in (exc.details() or "")
            else:
                raise AssertionError("a trigger without `model` is refused")

            reporting.cancel()
            await asyncio.gather(reporting, return_exceptions=True)
            assert scaler.terminate() == 0, scaler.log()
            assert await asyncio.wait_for(stream.read(), 5) is grpc.aio.EOF  # draining ends it: KEDA reconnects


async def test_a_reporter_that_disconnects_or_falls_silent_has_its_demand_dropped(tmp_path: Path) -> None:
    with service_process("scaler", tmp_path, {"MESHSERVE_SCALER_STALE_AFTER_S": "1"}) as scaler:
        async with grpc.aio.insecure_channel(scaler.address) as channel:
            keda = keda_grpc.ExternalScalerStub(channel)
            reports = demand_grpc.DemandServiceStub(channel)
            so = ref(scaler, model="fraud_mlp")

            def report(gateway: str, in_flight: int) -> demand_pb.DemandReport:
                entry = demand_pb.ModelDemand(model="fraud_mlp", subset="", in_flight=in_flight)
                return demand_pb.DemandReport(gateway=gateway, demand=[entry])

            leaving, staying = reports.Report(), reports.Report()
            await leaving.write(report("gateway-a", 3))
            await staying.write(report("gateway-b", 2))
            written = time.monotonic()  # gateway-b's last report
            await within(2, lambda: _equals(metric_value(keda, so), 5.0))
            leaving.cancel()  # the gateway went away: its connection's stream ends
            seconds = await within(2, lambda: _equals(metric_value(keda, so), 2.0))
            assert seconds < 0.5, seconds  # at once, not after stale_after_s

            # gateway-b's connection stays open but it sends nothing more: forgotten after stale_after_s (1 s),
            # and its stream is ended so that it reconnects.
            await within(4, lambda: _equals(metric_value(keda, so), 0.0))
            assert 1.0 <= time.monotonic() - written <= 3.0
            assert (await asyncio.wait_for(staying, 5)).reports == 1
            assert not (await keda.IsActive(so, timeout=5)).result
            metrics = scraped(scaler)
            assert 'meshserve_scaler_gateways_forgotten_total{reason="closed"} 1.0' in metrics
            assert 'meshserve_scaler_gateways_forgotten_total{reason="stale"} 1.0' in metrics


async def _equals(value: object, expected: float) -> bool:
    assert asyncio.iscoroutine(value)
    return await value == expected


def infer_request() -> pb.ModelInferRequest:
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 8])
    return pb.ModelInferRequest(
        model_name="mlp", inputs=[tensor], raw_input_contents=[np.zeros((1, 8), np.float32).tobytes()]
    )


async def test_a_gateway_process_reports_its_calls_in_flight(tmp_path: Path) -> None:
    """A real gateway (MESHSERVE_GATEWAY_SCALER_ADDRESS set) forwarding ModelInfer for a public model whose every
    forward takes 1.5 s (MESHSERVE_MODEL_FAULT_DELAY_MS): while the calls run, the scaler counts them per subset
    and StreamIsActive says active; when they are answered, inactive; when the gateway stops, it is forgotten."""
    write_model(tmp_path / "repo", "mlp", mlp_config("mlp"), {1: Mlp(1)})
    (tmp_path / "pipelines").mkdir()
    logs = tmp_path / "logs"
    nowhere = f"127.0.0.1:{free_port()}"  # feature and cache: not needed to forward ModelInfer
    with (
        model_service(
            tmp_path / "repo", logs, MESHSERVE_MODEL_WATCH="false", MESHSERVE_MODEL_FAULT_DELAY_MS="1500"
        ) as model,
        service_process("scaler", logs, {}) as scaler,
        gateway_service(
            logs,
            model.address,
            nowhere,
            nowhere,
            tmp_path / "pipelines",
            MESHSERVE_GATEWAY_PUBLIC_MODELS=json.dumps(["mlp"]),
            MESHSERVE_GATEWAY_SCALER_ADDRESS=scaler.address,
        ) as gateway,
    ):
        async with (
            grpc.aio.insecure_channel(scaler.address) as scaler_channel,
            grpc.aio.insecure_channel(gateway.address) as gateway_channel,
        ):
            keda = keda_grpc.ExternalScalerStub(scaler_channel)
            inference = pb_grpc.GRPCInferenceServiceStub(gateway_channel)
            await within(10, lambda: "meshserve_scaler_gateways 1.0" in scraped(scaler))  # the gateway connected
            stream = keda.StreamIsActive(ref(scaler, model="mlp"))
            assert (await asyncio.wait_for(stream.read(), 5)).result is False
            canary = (("x-canary", "true"),)
            calls = [
                inference.ModelInfer(infer_request(), timeout=30, metadata=canary if i < 2 else ()) for i in range(4)
            ]
            flip = asyncio.ensure_future(stream.read())
            await within(FLIP_WITHIN_S * 2, flip.done)
            assert flip.result().result is True
            await within(1.0, lambda: _equals(metric_value(keda, ref(scaler, model="mlp")), 4.0))
            assert await metric_value(keda, ref(scaler, model="mlp", subset="canary")) == 2.0
            responses = await asyncio.gather(*calls)
            assert [r.model_name for r in responses] == ["mlp"] * 4
            flip = asyncio.ensure_future(stream.read())
            await within(FLIP_WITHIN_S * 2, flip.done)
            assert flip.result().result is False
            assert await metric_value(keda, ref(scaler, model="mlp")) == 0.0
            stream.cancel()
            assert gateway.terminate() == 0, gateway.log()
            await within(5, lambda: "meshserve_scaler_gateways 0.0" in scraped(scaler))
    assert "reporting demand to the scaler" in gateway.log()
