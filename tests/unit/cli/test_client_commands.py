"""`meshserve infer` and `meshserve demo` against a fake v2 gateway served in-process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import pytest
from typer.testing import CliRunner

from services.cli.demo import DemoStats, histogram_lines, run_demo
from services.cli.infer import infer
from services.cli.main import app
from services.cli.stack.state import STATE_FILE
from services.common.tensor_codec import decode_request_inputs, encode_raw
from services.protos import inference_pb2, inference_pb2_grpc
from tests.helpers.servers import free_port

FRAUD_INPUTS = [
    ("event_time", "INT64"),
    ("user_id", "BYTES"),
    ("merchant_id", "BYTES"),
    ("device_id", "BYTES"),
    ("amount", "FP32"),
    ("country", "BYTES"),
    ("channel", "BYTES"),
    ("mcc", "BYTES"),
    ("card_present", "BOOL"),
    ("account_age_days", "FP32"),
]


class FakeGateway(inference_pb2_grpc.GRPCInferenceServiceServicer):
    """`fraud`: score = amount / 1000 (clipped); cache 'hit' on amounts seen before; unknown models NOT_FOUND."""

    def __init__(self) -> None:
        self.seen: set[float] = set()
        self.requests = 0

    def ModelMetadata(self, request, context):
        if request.name != "fraud":
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model '{request.name}'")
        response = inference_pb2.ModelMetadataResponse(name="fraud", versions=["1"], platform="pipeline")
        for name, datatype in FRAUD_INPUTS:
            response.inputs.add(name=name, datatype=datatype, shape=[-1, 1])
        response.outputs.add(name="score", datatype="FP32", shape=[-1, 1])
        return response

    def ModelInfer(self, request, context):
        self.requests += 1
        inputs = decode_request_inputs(request.inputs, request.raw_input_contents)
        if inputs["amount"].min() < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "amount must be >= 0")
        amount = inputs["amount"].astype(np.float64)
        response = inference_pb2.ModelInferResponse(model_name="fraud", model_version="1")
        datatype, shape, raw = encode_raw(np.clip(amount / 1000.0, 0, 1).astype(np.float32))
        response.outputs.add(name="score", datatype=datatype, shape=shape)
        response.raw_output_contents.append(raw)
        key = float(amount.sum())
        response.parameters["cache"].string_param = "hit" if key in self.seen else "miss"
        self.seen.add(key)
        response.parameters["model_version"].string_param = "1"
        if request.parameters["debug"].bool_param:
            response.parameters["stage_model_ms"].double_param = 0.5
        return response


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[str, FakeGateway]]:
    servicer = FakeGateway()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    inference_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(0)


ROW = (
    '{"event_time": 1717400000, "user_id": "u1", "merchant_id": "m2", "device_id": "d1_0", "amount": 250.0, '
    '"country": "us", "channel": "web", "mcc": "5411", "card_present": false, "account_age_days": 300}'
)


def test_infer_prints_outputs_and_parameters(gateway: tuple[str, FakeGateway]) -> None:
    address, _ = gateway
    result = infer(address, "fraud", f"[{ROW}, {ROW}]", debug=True)
    assert result["outputs"] == {"score": [[0.25], [0.25]]}
    assert result["parameters"]["stage_model_ms"] == 0.5 and result["parameters"]["model_version"] == "1"


def test_infer_command_errors_name_the_grpc_status(gateway: tuple[str, FakeGateway]) -> None:
    address, _ = gateway
    runner = CliRunner()
    ok = runner.invoke(app, ["infer", "fraud", "--json", ROW, "--address", address])
    assert ok.exit_code == 0, ok.output
    assert '"score"' in ok.stdout
    missing = runner.invoke(app, ["infer", "nope", "--json", ROW, "--address", address])
    assert missing.exit_code == 1 and "NOT_FOUND" in missing.output and "unknown model" in missing.output
    bad = runner.invoke(app, ["infer", "fraud", "--json", ROW.replace("250.0", "-1"), "--address", address])
    assert bad.exit_code == 1 and "INVALID_ARGUMENT: amount must be >= 0" in bad.output
    typo = runner.invoke(app, ["infer", "fraud", "--json", '{"amount": 1}', "--address", address])
    assert typo.exit_code == 2 and "missing field" in typo.output
    down = runner.invoke(app, ["infer", "fraud", "--json", ROW, "--address", f"127.0.0.1:{free_port()}"])
    assert down.exit_code == 1 and "UNAVAILABLE" in down.output and "meshserve up" in down.output


async def test_demo_sends_traffic_and_summarises(gateway: tuple[str, FakeGateway]) -> None:
    address, servicer = gateway
    before = servicer.requests
    summary = await run_demo(address, duration_s=1.0, concurrency=4, repeat=0.5, live=False)
    assert summary.ok > 10 and summary.ok == servicer.requests - before and not summary.errors
    assert summary.requests == summary.ok
    assert 0.2 < summary.cache_hit_ratio < 0.8
    assert sum(summary.score_histogram) == summary.ok
    assert summary.model_versions == {"1": summary.ok}
    assert 0 < summary.p50_ms <= summary.p99_ms
    assert summary.to_dict()["pipeline"] == "fraud"


def test_demo_stats_counts_errors_degradation_and_scores() -> None:
    stats = DemoStats("fraud", "x", 1)
    stats.ok(2.0, {"cache": "miss", "model_version": "2", "degraded": "stale_cache"}, np.array([[0.95]]))
    stats.ok(4.0, {"cache": "hit"}, np.array([[0.05]]))
    stats.error("RESOURCE_EXHAUSTED")
    s = stats.summary(elapsed_s=1.0)
    assert (s.requests, s.ok, s.errors) == (3, 2, {"RESOURCE_EXHAUSTED": 1})
    assert s.cache_hit_ratio == 0.5 and s.degraded_reasons == {"stale_cache": 1}
    assert s.score_histogram[0] == 1 and s.score_histogram[9] == 1
    assert len(histogram_lines(s.score_histogram)) == 10


def test_demo_stats_reports_the_calls_the_gateway_batched() -> None:
    stats = DemoStats("fraud", "x", 1)
    # two requests shared one features call, a third had its own; the model call of all three was one
    for features in (2, 2, 1):
        stats.ok(1.0, {"cache": "miss", "batch_features": features, "batch_model": 3}, None)
    stats.ok(1.0, {"cache": "hit"}, None)  # a near-cache hit made no call
    s = stats.summary(elapsed_s=1.0)
    assert s.batches == {"features": (1.5, 2), "model": (3.0, 3)}
    assert "features 1.5 (max 2)" in str(render_text(s))


def render_text(summary: object) -> str:
    from rich.console import Console

    from services.cli.demo import render

    console = Console(width=200, record=True)
    console.print(render(summary))  # type: ignore[arg-type]
    return console.export_text()


def test_infer_and_demo_call_the_entry_of_the_stack_in_their_log_dir(
    gateway: tuple[str, FakeGateway], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --address, a command calls the ingress that the stack.json of its --log-dir names, from any folder."""
    address, servicer = gateway
    logs = tmp_path / "other-stack"
    logs.mkdir()
    (logs / STATE_FILE).write_text(json.dumps({"ingress": address, "gateway": "127.0.0.1:1", "insecure": True}))
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    before = servicer.requests
    ok = runner.invoke(app, ["infer", "fraud", "--json", ROW, "--log-dir", str(logs)])
    assert ok.exit_code == 0, ok.output
    assert servicer.requests == before + 1
    demo = runner.invoke(app, ["demo", "--duration", "0.3", "--concurrency", "1", "--no-live", "--log-dir", str(logs)])
    assert demo.exit_code == 0, demo.output
    assert servicer.requests > before + 1
