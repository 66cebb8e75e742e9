"""bench.chaos.load: distinct requests patched from templates, answers read, and the open-loop schedule against an
in-process grpc.aio server that answers whole, degraded, refused, failed or not at all."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from bench.chaos.load import OpenLoop, read_answer, request_bytes, request_templates
from bench.chaos.outcomes import DEGRADED, FAILED, LOST, REFUSED, WHOLE, Outcome
from services.cli.traffic import FIELDS
from services.protos import inference_pb2 as pb


def test_requests_are_valid_fraud_requests_with_distinct_ids() -> None:
    templates = request_templates(4, 1_700_000_000)
    requests = [pb.ModelInferRequest.FromString(request_bytes(templates, i)) for i in range(10)]
    users = {r.raw_input_contents[FIELDS.index("user_id")] for r in requests}
    devices = {r.raw_input_contents[FIELDS.index("device_id")] for r in requests}
    assert len(users) == len(devices) == 10
    first = requests[3]
    assert first.model_name == "fraud" and "debug" not in first.parameters
    assert [t.name for t in first.inputs] == list(FIELDS)
    user = first.raw_input_contents[FIELDS.index("user_id")]
    assert int.from_bytes(user[:4], "little") == len(user) - 4 and user[4:] == b"user-000000000003"
    amount = FIELDS.index("amount")
    assert requests[3].raw_input_contents[amount] == requests[7].raw_input_contents[amount]  # both template 3


def reply(degraded: str = "", version: str = "1") -> bytes:
    response = pb.ModelInferResponse(model_name="fraud")
    response.parameters["model_version"].string_param = version
    if degraded:
        response.parameters["degraded"].string_param = degraded
    return response.SerializeToString()


def test_read_answer_takes_degraded_and_the_version_from_the_parameters() -> None:
    assert read_answer(reply()) == (Outcome(WHOLE), "1")
    assert read_answer(reply("model_timeout:fallback_model", "2")) == (
        Outcome(DEGRADED, "model_timeout:fallback_model"),
        "2",
    )


async def serve(behaviour: list[str]) -> tuple[grpc.aio.Server, int]:
    """A ModelInfer server answering request n with behaviour[n % len]."""
    served = 0

    async def infer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        nonlocal served
        what = behaviour[served % len(behaviour)]
        served += 1
        if what == "refuse":
            context.set_trailing_metadata((("grpc-retry-pushback-ms", "50"),))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "overloaded")
        if what == "fail":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no healthy upstream")
        if what == "hang":
            await asyncio.sleep(5)
        return reply("features_degraded" if what == "degrade" else "")

    handler = grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", {"ModelInfer": grpc.unary_unary_rpc_method_handler(infer)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


@pytest.mark.timeout(30)
def test_open_loop_keeps_its_schedule_and_classifies_every_answer() -> None:
    async def main() -> OpenLoop:
        server, port = await serve(["whole", "degrade", "refuse", "fail", "hang"])
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                load = OpenLoop(channel, request_templates(2, 1_700_000_000), 0.3, time.perf_counter())
                stop = asyncio.Event()
                runner = asyncio.create_task(load.run(stop))
                load.set_rate(100)
                await asyncio.sleep(1.0)
                load.set_rate(0)
                await load.drain()
                stop.set()
                await runner
                return load
        finally:
            await server.stop(0)

    load = asyncio.run(main())
    assert 90 <= load.sent <= 110  # open loop: the hung fifth of the calls never slowed the schedule
    assert len(load.samples) == load.sent
    kinds = {k: sum(s.kind == k for s in load.samples) for k in (WHOLE, DEGRADED, REFUSED, FAILED, LOST)}
    assert all(abs(n - load.sent / 5) <= 2 for n in kinds.values()), kinds
    assert {s.reason for s in load.samples if s.kind == FAILED} == {"UNAVAILABLE"}
    assert all(s.latency_s == 0.3 for s in load.samples if s.kind == LOST)
    assert all(0 <= s.late_s < 0.5 for s in load.samples)
