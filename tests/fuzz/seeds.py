"""Valid requests for every RPC of every service (as the repository's tests and its demo send them), with the
names in them that the fuzzer reuses; each must succeed against the fuzz stack."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from services.common.tensor_codec import NUMPY_DTYPES, encode_raw, fill_contents
from services.feature.api import to_row
from services.protos import cache_pb2, feature_pb2
from services.protos import inference_pb2 as pb
from tests.helpers.fixtures import T0, fraud_row

# The gateway's operator token in the fuzz stack: RepositoryModelLoad/Unload need it there.
ADMIN_TOKEN = "fuzz-operator-token"
ADMIN = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
DEMO_MODELS = ("fraud_mlp", "digits_cnn")


@dataclass(frozen=True)
class Seed:
    """A valid request and the metadata it is sent with."""

    request: Message
    metadata: tuple[tuple[str, str], ...] = ()


def infer(model: str, arrays: dict[str, np.ndarray], raw: bool = True, **fields: object) -> pb.ModelInferRequest:
    """A ModelInferRequest carrying `arrays` as raw_input_contents (or typed contents)."""
    request = pb.ModelInferRequest(model_name=model, **fields)  # type: ignore[arg-type]
    for name, array in arrays.items():
        tensor = request.inputs.add(name=name, shape=list(array.shape))
        if raw:
            tensor.datatype, _, data = encode_raw(array)
            request.raw_input_contents.append(data)
        else:
            tensor.datatype = fill_contents(tensor.contents, array)
    return request


def transactions(rows: int = 2) -> dict[str, np.ndarray]:
    """The fraud pipeline's raw fields, [rows, 1] each (as tests/compat/gateway_helpers.py builds them)."""

    def text(prefix: str) -> np.ndarray:
        return np.array([[f"{prefix}-{i}".encode()] for i in range(rows)], dtype=object)

    return {
        "event_time": np.full((rows, 1), T0, np.int64),
        "user_id": text("user"),
        "merchant_id": text("merchant"),
        "device_id": text("device"),
        "amount": np.full((rows, 1), 42.5, np.float32),
        "country": np.array([[b"US"]] * rows, dtype=object),
        "channel": np.array([[b"web"]] * rows, dtype=object),
        "mcc": np.array([[b"5411"]] * rows, dtype=object),
        "card_present": np.array([[i % 2 == 0] for i in range(rows)]),
        "account_age_days": np.full((rows, 1), 400.0, np.float32),
    }


def features(rows: int = 2) -> np.ndarray:
    return np.linspace(-1, 1, rows * 64, dtype=np.float32).reshape(rows, 64)


def image() -> np.ndarray:
    return np.linspace(0, 1, 64, dtype=np.float32).reshape(1, 1, 8, 8)


def _kv(key: str, value: common_pb2.AnyValue) -> common_pb2.KeyValue:
    return common_pb2.KeyValue(key=key, value=value)


def export(trace_id: int = 1, span_id: int = 1) -> otlp.ExportTraceServiceRequest:
    """One SERVER span of service 'fuzz' (attributes of each kind, a link), as the OTel SDK exports it."""
    span = trace_pb2.Span(
        trace_id=trace_id.to_bytes(16, "big"),
        span_id=span_id.to_bytes(8, "big"),
        parent_span_id=(span_id + 1).to_bytes(8, "big"),
        name="/inference.GRPCInferenceService/ModelInfer",
        kind=trace_pb2.Span.SPAN_KIND_SERVER,
        start_time_unix_nano=T0 * 10**9,
        end_time_unix_nano=T0 * 10**9 + 2_500_000,
        status=trace_pb2.Status(code=trace_pb2.Status.STATUS_CODE_OK),
        attributes=[
            _kv("rpc.method", common_pb2.AnyValue(string_value="ModelInfer")),
            _kv("rpc.grpc.status_code", common_pb2.AnyValue(int_value=0)),
            _kv("batch.rows", common_pb2.AnyValue(double_value=2.0)),
            _kv("degraded", common_pb2.AnyValue(bool_value=False)),
            _kv("ids", common_pb2.AnyValue(array_value=common_pb2.ArrayValue(values=[common_pb2.AnyValue()]))),
        ],
        links=[trace_pb2.Span.Link(trace_id=(trace_id + 1).to_bytes(16, "big"), span_id=(7).to_bytes(8, "big"))],
    )
    service = _kv("service.name", common_pb2.AnyValue(string_value="fuzz"))
    return otlp.ExportTraceServiceRequest(
        resource_spans=[
            trace_pb2.ResourceSpans(
                resource=resource_pb2.Resource(attributes=[service]),
                scope_spans=[trace_pb2.ScopeSpans(spans=[span])],
            )
        ]
    )


def _inference_common(model: str) -> dict[str, list[Seed]]:
    return {
        "ServerLive": [Seed(pb.ServerLiveRequest())],
        "ServerReady": [Seed(pb.ServerReadyRequest())],
        "ServerMetadata": [Seed(pb.ServerMetadataRequest())],
        "ModelReady": [Seed(pb.ModelReadyRequest(name=model))],
        "ModelMetadata": [Seed(pb.ModelMetadataRequest(name=model))],
        "ModelStatistics": [Seed(pb.ModelStatisticsRequest(name=model)), Seed(pb.ModelStatisticsRequest())],
        "RepositoryIndex": [Seed(pb.RepositoryIndexRequest(ready=True))],
    }


def _model() -> dict[str, list[Seed]]:
    outputs = [pb.ModelInferRequest.InferRequestedOutputTensor(name="label")]
    return {
        **_inference_common("fraud_mlp"),
        "ModelReady": [Seed(pb.ModelReadyRequest(name="digits_cnn", version="1"))],
        "ModelMetadata": [Seed(pb.ModelMetadataRequest(name="fraud_mlp", version="2"))],
        "ModelConfig": [Seed(pb.ModelConfigRequest(name="digits_cnn"))],
        "ModelInfer": [
            Seed(infer("fraud_mlp", {"features": features(2)}, id="r1")),
            Seed(infer("fraud_mlp", {"features": features(1)}, raw=False, model_version="1")),
            Seed(infer("digits_cnn", {"image": image()}, outputs=outputs)),
        ],
        "RepositoryModelLoad": [Seed(pb.RepositoryModelLoadRequest(model_name="fraud_mlp"))],
        "RepositoryModelUnload": [Seed(pb.RepositoryModelUnloadRequest(model_name="digits_cnn"))],
    }


def _gateway() -> dict[str, list[Seed]]:
    priority = {"priority": pb.InferParameter(string_param="high"), "debug": pb.InferParameter(bool_param=True)}
    return {
        **_inference_common("fraud"),
        "ModelConfig": [Seed(pb.ModelConfigRequest(name="digits"))],
        "ModelInfer": [
            Seed(infer("fraud", transactions(2), id="t1")),
            Seed(infer("fraud", transactions(1), raw=False, parameters=priority)),
            Seed(infer("digits", {"image": image() * 16})),
            Seed(infer("digits_cnn", {"image": image()})),  # a public model, forwarded as it is
        ],
        "RepositoryModelLoad": [Seed(pb.RepositoryModelLoadRequest(model_name="fraud_mlp"), ADMIN)],
        "RepositoryModelUnload": [Seed(pb.RepositoryModelUnloadRequest(model_name="digits_cnn"), ADMIN)],
    }


def _feature() -> dict[str, list[Seed]]:
    rows = [to_row(fraud_row()), to_row(fraud_row(user_id="u2", amount=3.25, card_present=False))]
    event = to_row(fraud_row(event_time=T0 - 3600))
    return {
        "Compute": [Seed(feature_pb2.ComputeRequest(feature_set="fraud_v1", rows=rows, budget_ms=500))],
        "Ingest": [Seed(feature_pb2.IngestRequest(feature_set="fraud_v1", events=[event]))],
        "GetFeatureSet": [Seed(feature_pb2.GetFeatureSetRequest(feature_set="fraud_v1"))],
    }


def _cache() -> dict[str, list[Seed]]:
    key = bytes(range(32))
    entry = cache_pb2.StoreEntry(
        key=key, value=b"answer", pipeline="fuzz", model_name="fraud_mlp", model_version="1", ttl_s=30, stale_ttl_s=60
    )
    return {
        "Lookup": [Seed(cache_pb2.LookupRequest(keys=[key, b"other"], pipeline="fuzz", allow_stale=True))],
        "Store": [Seed(cache_pb2.StoreRequest(entries=[entry]))],
        "Invalidate": [
            Seed(cache_pb2.InvalidateRequest(pipeline="fuzz")),
            Seed(cache_pb2.InvalidateRequest(model_name="fraud_mlp", model_version="1")),
        ],
        "Stats": [Seed(cache_pb2.StatsRequest())],
        "Watch": [Seed(cache_pb2.WatchRequest())],
    }


# service -> RPC name -> valid requests
SEEDS: dict[str, dict[str, list[Seed]]] = {
    "model": _model(),
    "gateway": _gateway(),
    "feature": _feature(),
    "cache": _cache(),
    "traces": {"Export": [Seed(export())]},
}
# A request per service (its RPC and the request) that must still succeed after any RPC's examples.
PROBES: dict[str, tuple[str, Seed]] = {
    "model": ("ModelInfer", SEEDS["model"]["ModelInfer"][0]),
    "gateway": ("ModelInfer", SEEDS["gateway"]["ModelInfer"][0]),
    "feature": ("Compute", SEEDS["feature"]["Compute"][0]),
    "cache": ("Lookup", SEEDS["cache"]["Lookup"][0]),
    "traces": ("Export", SEEDS["traces"]["Export"][0]),
}


def _strings(message: Message) -> Iterator[str]:
    for field, value in message.ListFields():
        if field.type == FieldDescriptor.TYPE_STRING:
            yield from (value if field.is_repeated else [value])
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                for key, item in value.items():
                    yield from [key] if isinstance(key, str) else []
                    yield from _strings(item) if isinstance(item, Message) else []
            else:
                for item in value if field.is_repeated else [value]:
                    yield from _strings(item)


def names() -> tuple[str, ...]:
    """Every string the seeds send (model, pipeline, input, feature-set names...), the v2 datatypes (and their
    lowercase spellings) and the demo's other names: what a mistaken caller mixes up."""
    every = (seed for requests in SEEDS.values() for seeds in requests.values() for seed in seeds)
    found = {text for seed in every for text in _strings(seed.request)}
    found |= set(NUMPY_DTYPES) | {d.lower() for d in NUMPY_DTYPES} | {"features", "image", "score", "label", "fraud"}
    found |= {"digits", "fraud_v1", "fraud_mlp", "digits_cnn", "1", "2", "3", "0", "-1", "high", "low", "normal"}
    return tuple(sorted(found))
