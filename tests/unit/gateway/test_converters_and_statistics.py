"""Protobuf <-> domain for the gateway (requests, responses, cached answers, metadata, config, statistics, index),
Triton-style statistics, and the version refresher."""

from __future__ import annotations

import numpy as np
import pytest

from services.cache.api import CachedValue
from services.common.errors import InvalidArgument
from services.common.tensor_codec import decode_raw_inputs, serialize_bytes
from services.gateway import cache_converters, converters
from services.gateway.admission import Priority
from services.gateway.domain import Answer, OutputSpec, PipelineResponse
from services.gateway.pipeline_stats import Statistics
from services.gateway.versions import ServingVersions, VersionRefresher
from services.protos import inference_pb2 as pb
from services.protos import model_config_pb2 as mc
from tests.unit.gateway.fakes import FakeModel, pipeline, score


def infer_request() -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="p", model_version="1", id="abc")
    message.inputs.add(name="user_id", datatype="BYTES", shape=[2, 1])
    message.raw_input_contents.append(serialize_bytes(np.array([b"a", b"b"], dtype=object)))
    message.inputs.add(name="amount", datatype="FP32", shape=[2, 1])
    message.raw_input_contents.append(np.array([1.5, 2.5], np.float32).tobytes())
    message.outputs.add(name="score")
    return message


def test_an_infer_request_becomes_a_pipeline_request() -> None:
    message = infer_request()
    message.parameters["debug"].bool_param = True
    message.parameters["priority"].string_param = "low"
    request = converters.infer_request_from_pb(message, converters.priority_of(message))
    assert (request.pipeline, request.version, request.id) == ("p", "1", "abc")
    assert (request.requested_outputs, request.debug, request.priority) == (["score"], True, Priority.LOW)
    assert request.inputs == {} and request.wire is not None  # raw contents stay undecoded until needed
    assert [(t.name, t.datatype, t.shape) for t in request.wire] == [
        ("user_id", "BYTES", (2, 1)),
        ("amount", "FP32", (2, 1)),
    ]
    decoded = decode_raw_inputs(request.wire)
    assert decoded["user_id"].tolist() == [[b"a"], [b"b"]]
    assert decoded["amount"].dtype == np.float32 and decoded["amount"].shape == (2, 1)


def test_typed_contents_are_decoded_at_once() -> None:
    message = pb.ModelInferRequest(model_name="p")
    tensor = message.inputs.add(name="amount", datatype="FP32", shape=[2, 1])
    tensor.contents.fp32_contents.extend([1.5, 2.5])
    request = converters.infer_request_from_pb(message, Priority.NORMAL)
    assert request.wire is None and request.inputs["amount"].tolist() == [[1.5], [2.5]]


@pytest.mark.parametrize(
    ("kind", "value", "expected"),
    [("int64_param", 1, Priority.HIGH), ("int64_param", 0, Priority.NORMAL), ("string_param", "HIGH", Priority.HIGH)],
)
def test_the_priority_parameter(kind: str, value: object, expected: Priority) -> None:
    message = infer_request()
    setattr(message.parameters["priority"], kind, value)
    assert converters.priority_of(message) == expected
    assert converters.priority_of(infer_request()) == Priority.NORMAL
    message.parameters["priority"].string_param = "urgent"
    with pytest.raises(InvalidArgument):
        converters.priority_of(message)


def test_without_debug_parameter_there_are_no_stage_times() -> None:
    message = infer_request()
    assert not converters.infer_request_from_pb(message, Priority.NORMAL).debug
    message.parameters["debug"].bool_param = False
    assert not converters.infer_request_from_pb(message, Priority.NORMAL).debug


def test_a_response_carries_its_parameters() -> None:
    plain = PipelineResponse("p", "abc", [score(0.25, 2)], "2", "hit")
    message = converters.infer_response_to_pb(plain)
    assert (message.model_name, message.model_version, message.id) == ("p", "1", "abc")
    assert [(o.name, o.datatype, list(o.shape)) for o in message.outputs] == [("score", "FP32", [2, 1])]
    assert np.frombuffer(message.raw_output_contents[0], np.float32).tolist() == [0.25, 0.25]
    assert set(message.parameters) == {"model_version", "cache"}
    assert message.parameters["model_version"].string_param == "2"
    degraded = PipelineResponse(
        "p", "", [], "default", "miss", "model_unavailable:default", "down", {"model": 1.23456, "total": 2.0}
    )
    degraded.default_decision = "review"
    params = converters.infer_response_to_pb(degraded).parameters
    assert params["default_decision"].string_param == "review"
    assert params["degraded"].string_param == "model_unavailable:default"
    assert params["degraded_detail"].string_param == "down"
    assert params["stage_model_ms"].double_param == 1.2346 and params["stage_total_ms"].double_param == 2.0


def test_an_answer_survives_the_cache() -> None:
    answer = Answer([score(0.75, 3)], "2", "miss", degraded=None)
    value = cache_converters.answer_to_cache_value(answer, "m")
    back = cache_converters.answer_from_cache(CachedValue(value, "2", 5.0, False), "hit")
    assert (back.outputs, back.model_version, back.cache) == (answer.outputs, "2", "hit")
    # a value without a version takes the entry's
    bare = pb.ModelInferResponse(model_name="m").SerializeToString()
    assert cache_converters.answer_from_cache(CachedValue(bare, "7", 1.0, True), "stale").model_version == "7"


def test_pipeline_metadata_and_config() -> None:
    spec = pipeline()
    outputs = {"score": OutputSpec("FP32", [1])}
    metadata = converters.metadata_to_pb(spec, outputs)
    assert (metadata.name, list(metadata.versions), metadata.platform) == ("p", ["1"], "meshserve_pipeline")
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("user_id", "BYTES", [-1, 1]),
        ("amount", "FP32", [-1, 1]),
    ]
    assert [(t.name, list(t.shape)) for t in metadata.outputs] == [("score", [-1, 1])]
    config = converters.config_to_pb(spec, outputs).config
    assert (config.name, config.backend, config.max_batch_size) == ("p", "meshserve", 8)
    assert [(i.name, i.data_type) for i in config.input] == [("user_id", mc.TYPE_STRING), ("amount", mc.TYPE_FP32)]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [("score", mc.TYPE_FP32, [1])]
    assert config.parameters["model"].string_value == "m"
    assert config.parameters["feature_set"].string_value == "fs_v1"
    assert "feature_set" not in converters.config_to_pb(pipeline(features=None), outputs).config.parameters


def test_server_metadata_and_index() -> None:
    server = converters.server_metadata_to_pb()
    assert (server.name, list(server.extensions)) == (
        "meshserve-gateway",
        ["model_repository", "statistics", "pipelines"],
    )
    index = converters.pipeline_index(["b", "a"])
    assert [(m.name, m.version, m.state, m.reason) for m in index] == [
        ("a", "1", "READY", "pipeline"),
        ("b", "1", "READY", "pipeline"),
    ]


def test_statistics_count_like_triton() -> None:
    stats = Statistics(["p", "q"])
    miss = Answer([], "1", "miss", stages_ms={"cache": 1.0, "features": 2.0, "model": 3.0, "total": 6.5})
    hit = Answer([], "1", "hit", stages_ms={"cache": 0.5, "total": 0.6})
    stats.succeeded("p", miss, rows=4, elapsed_s=0.007)
    stats.succeeded("p", hit, rows=1, elapsed_s=0.001)
    stats.failed("p", elapsed_s=0.002)
    p = stats.of("p")["p"]
    assert (p.success_count, p.success_ns, p.inferences) == (2, 8_000_000, 5)
    assert (p.model_count, p.model_ns, p.features_ns) == (1, 3_000_000, 2_000_000)
    assert (p.fail_count, p.fail_ns) == (1, 2_000_000) and p.last_ms > 0
    assert list(stats.of()) == ["p", "q"]
    message = converters.statistics_to_pb(stats.of())
    first = message.model_stats[0]
    assert (first.name, first.version, first.inference_count, first.execution_count) == ("p", "1", 5, 1)
    s = first.inference_stats
    assert (s.success.count, s.fail.count, s.queue.count) == (2, 1, 2)
    assert (s.compute_input.ns, s.compute_infer.ns, s.compute_output.count) == (2_000_000, 3_000_000, 1)
    assert message.model_stats[1].inference_stats.success.count == 0


async def test_the_refresher_learns_versions_and_outputs_and_keeps_them_when_the_model_is_away() -> None:
    log: list[str] = []
    model = FakeModel(log)
    versions = ServingVersions(60.0)
    refresher = VersionRefresher(model, ["m", "m"], versions, period_s=60.0)
    await refresher.refresh()
    assert log == ["model.describe m"]
    assert versions.current("m") == ["2", "1"]
    assert refresher.outputs == {"m": {"score": OutputSpec("FP32", [1])}}
    model.reachable = False
    await refresher.refresh()
    assert refresher.outputs == {"m": {"score": OutputSpec("FP32", [1])}}
