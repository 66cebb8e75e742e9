"""Protobuf <-> domain conversions of the model service, on real messages and real loaded model versions."""

from __future__ import annotations

import numpy as np
import pytest

from services.common.errors import InvalidArgument
from services.common.tensor_codec import decode_tensor, encode_raw, fill_contents
from services.model import converters
from services.model.domain import InferenceRequest, InferenceResponse, ModelMetadata, ServerMetadata
from services.model.handler import ModelHandler
from services.model.manager import RepositoryEntry
from services.model.stats import VersionStats
from services.protos import inference_pb2 as pb
from services.protos import model_config_pb2 as mc


def test_infer_request_from_raw_contents() -> None:
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    request = pb.ModelInferRequest(model_name="mlp", model_version="2", id="r1")
    datatype, shape, raw = encode_raw(x)
    request.inputs.add(name="x", datatype=datatype, shape=shape)
    request.raw_input_contents.append(raw)
    request.outputs.add(name="y")
    domain = converters.infer_request_from_pb(request)
    assert isinstance(domain, InferenceRequest)
    assert (domain.model_name, domain.model_version, domain.id, domain.requested_outputs) == ("mlp", "2", "r1", ["y"])
    np.testing.assert_array_equal(domain.inputs["x"], x)


def test_infer_request_from_typed_contents() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([10, 20], dtype=np.int64)
    request = pb.ModelInferRequest(model_name="multi")
    for name, array in (("a", a), ("b", b)):
        tensor = request.inputs.add(name=name, shape=array.shape)
        tensor.datatype = fill_contents(tensor.contents, array)
    domain = converters.infer_request_from_pb(request)
    assert domain.model_version == "" and domain.requested_outputs == []
    np.testing.assert_array_equal(domain.inputs["a"], a)
    assert domain.inputs["b"].dtype == np.int64
    np.testing.assert_array_equal(domain.inputs["b"], b)


def test_infer_request_with_mismatched_raw_contents_is_invalid() -> None:
    request = pb.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 8])
    request.raw_input_contents.append(b"\0" * 4)
    with pytest.raises(InvalidArgument, match="raw contents hold 4 bytes"):
        converters.infer_request_from_pb(request)


def test_infer_response_travels_as_raw_output_contents() -> None:
    y = np.linspace(0, 1, 4, dtype=np.float32).reshape(4, 1)
    label = np.array([[1], [0], [3], [2]], dtype=np.int64)
    message = converters.infer_response_to_pb(InferenceResponse("m", "3", {"y": y, "label": label}, "r9"))
    assert (message.model_name, message.model_version, message.id) == ("m", "3", "r9")
    assert [(o.name, o.datatype, list(o.shape)) for o in message.outputs] == [
        ("y", "FP32", [4, 1]),
        ("label", "INT64", [4, 1]),
    ]
    for out, raw, expected in zip(message.outputs, message.raw_output_contents, (y, label), strict=True):
        np.testing.assert_array_equal(decode_tensor(out.name, out.datatype, out.shape, None, raw), expected)


def test_server_metadata_to_pb() -> None:
    message = converters.server_metadata_to_pb(ServerMetadata("meshserve", "0.1.0", ("statistics", "x")))
    assert (message.name, message.version, list(message.extensions)) == ("meshserve", "0.1.0", ["statistics", "x"])


def test_metadata_shapes_carry_a_batch_dimension_only_for_batched_models(handler: ModelHandler) -> None:
    batched = converters.metadata_to_pb(handler.metadata("mlp", ""))
    assert (batched.name, list(batched.versions), batched.platform) == ("mlp", ["2", "3"], "pytorch_libtorch")
    assert [(t.name, t.datatype, list(t.shape)) for t in batched.inputs] == [("x", "FP32", [-1, 8])]
    assert [(t.name, t.datatype, list(t.shape)) for t in batched.outputs] == [("y", "FP32", [-1, 1])]
    unbatched = converters.metadata_to_pb(ModelMetadata(handler.config("multi"), [1]))
    assert [(t.name, t.datatype, list(t.shape)) for t in unbatched.inputs] == [
        ("a", "FP32", [2, 3]),
        ("b", "INT64", [2]),
    ]


def test_config_is_tritons_model_config_message(handler: ModelHandler) -> None:
    version = handler.config("batched")
    batched = converters.config_to_pb(version)
    assert isinstance(batched, mc.ModelConfig)
    assert (batched.name, batched.platform, batched.backend, batched.max_batch_size) == (
        "batched",
        "pytorch_libtorch",
        "pytorch",
        16,
    )
    assert [(i.name, i.data_type, list(i.dims)) for i in batched.input] == [("x", mc.TYPE_FP32, [8])]
    assert [(o.name, o.data_type, list(o.dims)) for o in batched.output] == [("y", mc.TYPE_FP32, [1])]
    assert batched.HasField("dynamic_batching")
    assert batched.dynamic_batching.max_queue_delay_microseconds == 0
    assert batched.dynamic_batching.default_queue_policy.max_queue_size == 64
    on_gpu = version.model.device.startswith("cuda")
    kind = mc.ModelInstanceGroup.KIND_GPU if on_gpu else mc.ModelInstanceGroup.KIND_CPU
    assert [(g.name, g.count, g.kind) for g in batched.instance_group] == [("batched", 2, kind)]
    assert batched.version_policy.latest.num_versions == 1
    assert batched.parameters["quantization"].string_value == "none"

    mlp = converters.config_to_pb(handler.config("mlp"))
    assert not mlp.HasField("dynamic_batching") and mlp.version_policy.latest.num_versions == 2
    int8 = converters.config_to_pb(handler.config("int8", "2"))
    assert int8.version_policy.HasField("all") and int8.parameters["quantization"].string_value == "int8"
    assert converters.config_to_pb(handler.config("int8", "1")).parameters["quantization"].string_value == "none"
    assert converters.config_response_to_pb(handler.config("multi")).config.max_batch_size == 0


def test_statistics_to_pb_carries_counts_and_durations() -> None:
    stats = VersionStats("conv", 4)
    stats.record_batch(rows=3, input_ns=10, infer_ns=200, output_ns=5, queue_ns=[7, 9])
    stats.record_request(True, 300)
    stats.record_request(False, 40, "INVALID_ARGUMENT")
    (message,) = converters.statistics_to_pb([stats]).model_stats
    assert (message.name, message.version, message.inference_count, message.execution_count) == ("conv", "4", 3, 1)
    infer = message.inference_stats
    assert (infer.success.count, infer.success.ns, infer.fail.count, infer.fail.ns) == (1, 300, 1, 40)
    assert (infer.queue.count, infer.queue.ns) == (2, 16)
    assert (infer.compute_infer.count, infer.compute_infer.ns) == (2, 400)  # each request charged the whole batch
    assert [(b.batch_size, b.compute_infer.count, b.compute_infer.ns) for b in message.batch_stats] == [(3, 1, 200)]
    assert message.last_inference > 0


def test_repository_index_to_pb() -> None:
    entries = [RepositoryEntry("m", "1", "READY"), RepositoryEntry("n", "", "UNAVAILABLE", "not loaded")]
    message = converters.repository_index_to_pb(entries)
    assert [(m.name, m.version, m.state, m.reason) for m in message.models] == [
        ("m", "1", "READY", ""),
        ("n", "", "UNAVAILABLE", "not loaded"),
    ]
