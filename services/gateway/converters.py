"""Protobuf <-> the gateway's domain types: v2 requests and responses, pipeline metadata, config, statistics and
repository index (pure functions, no logic beyond the mapping; the cached form of an answer is in
cache_converters.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from services.common.tensor_codec import decode_request_inputs
from services.common.triton_config import MODEL_CONFIG_DATA_TYPES
from services.gateway.admission import Priority, parse_priority
from services.gateway.domain import PIPELINE_VERSION, OutputSpec, PipelineRequest, PipelineResponse, WireTensor
from services.gateway.pipeline import PipelineSpec
from services.gateway.pipeline_stats import PipelineStats
from services.protos import inference_pb2 as pb
from services.protos import model_config_pb2 as mc

SERVER_NAME = "meshserve-gateway"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ["model_repository", "statistics", "pipelines"]
PLATFORM = "meshserve_pipeline"


def _param(value: pb.InferParameter) -> str | int | bool | float | None:
    kind = value.WhichOneof("parameter_choice")
    return None if kind is None else getattr(value, kind)


def priority_of(request: pb.ModelInferRequest) -> Priority:
    """The `priority` request parameter (also for forwarded models: admission applies to them too)."""
    return parse_priority(_param(request.parameters["priority"]) if "priority" in request.parameters else None)


def infer_request_from_pb(request: pb.ModelInferRequest, priority: Priority) -> PipelineRequest:
    """Inputs sent as raw contents (one per input, no typed contents beside) stay undecoded in `wire`; any others
    are decoded into `inputs`."""
    raw = request.raw_input_contents
    tensors = request.inputs
    wire = None
    if raw and len(raw) == len(tensors) and not any(t.HasField("contents") for t in tensors):
        wire = [WireTensor(t.name, t.datatype, tuple(t.shape), raw[i]) for i, t in enumerate(tensors)]
    return PipelineRequest(
        pipeline=request.model_name,
        inputs={} if wire is not None else decode_request_inputs(tensors, raw),
        wire=wire,
        version=request.model_version,
        id=request.id,
        requested_outputs=[o.name for o in request.outputs],
        debug="debug" in request.parameters and bool(_param(request.parameters["debug"])),
        priority=priority,
    )


def infer_response_to_pb(response: PipelineResponse) -> pb.ModelInferResponse:
    """Outputs as raw_output_contents; `model_version`, `cache`, `degraded`, `meshserve_tier` (two tiers) and stage
    times as parameters."""
    message = pb.ModelInferResponse(model_name=response.pipeline, model_version=PIPELINE_VERSION, id=response.id)
    for tensor in response.outputs:
        message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        message.raw_output_contents.append(tensor.raw)
    params = message.parameters
    params["model_version"].string_param = response.model_version
    params["cache"].string_param = response.cache
    if response.degraded:
        params["degraded"].string_param = response.degraded
        params["degraded_detail"].string_param = response.degraded_detail or ""
    if response.default_decision:
        params["default_decision"].string_param = response.default_decision
    if response.tier:
        params["meshserve_tier"].string_param = response.tier
    for stage, ms in response.stages_ms.items():
        params[f"stage_{stage}_ms"].double_param = round(ms, 4)
    for stage, requests in response.batches.items():
        params[f"batch_{stage}"].int64_param = requests
    return message


def server_metadata_to_pb() -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(name=SERVER_NAME, version=SERVER_VERSION, extensions=EXTENSIONS)


def metadata_to_pb(spec: PipelineSpec, outputs: Mapping[str, OutputSpec]) -> pb.ModelMetadataResponse:
    """A pipeline as a v2 model: its raw inputs, and its model's outputs it returns (batch dimension -1)."""
    tensor = pb.ModelMetadataResponse.TensorMetadata
    return pb.ModelMetadataResponse(
        name=spec.name,
        versions=[PIPELINE_VERSION],
        platform=PLATFORM,
        inputs=[tensor(name=i.name, datatype=i.datatype, shape=[-1, *i.dims]) for i in spec.inputs],
        outputs=[tensor(name=n, datatype=outputs[n].datatype, shape=[-1, *outputs[n].dims]) for n in spec.outputs],
    )


def config_to_pb(spec: PipelineSpec, outputs: Mapping[str, OutputSpec]) -> pb.ModelConfigResponse:
    """A pipeline in Triton's model-config message (perf_analyzer needs it), naming its model and feature set."""
    types = MODEL_CONFIG_DATA_TYPES
    config = mc.ModelConfig(
        name=spec.name,
        platform=PLATFORM,
        backend="meshserve",
        max_batch_size=spec.max_batch_size,
        input=[mc.ModelInput(name=i.name, data_type=types[i.datatype], dims=i.dims) for i in spec.inputs],
        output=[
            mc.ModelOutput(name=n, data_type=types[outputs[n].datatype], dims=outputs[n].dims) for n in spec.outputs
        ],
    )
    config.parameters["model"].string_value = spec.model.name
    if spec.features is not None:
        config.parameters["feature_set"].string_value = spec.features.feature_set
    return pb.ModelConfigResponse(config=config)


def statistics_to_pb(stats: Mapping[str, PipelineStats]) -> pb.ModelStatisticsResponse:
    """Triton's statistics: features count as compute_input, the model call as compute_infer."""
    out = pb.ModelStatisticsResponse()
    d = pb.StatisticDuration
    for name, s in stats.items():
        out.model_stats.add(
            name=name,
            version=PIPELINE_VERSION,
            last_inference=s.last_ms,
            inference_count=s.inferences,
            execution_count=s.model_count,
            inference_stats=pb.InferStatistics(
                success=d(count=s.success_count, ns=s.success_ns),
                fail=d(count=s.fail_count, ns=s.fail_ns),
                queue=d(count=s.success_count, ns=0),
                compute_input=d(count=s.model_count, ns=s.features_ns),
                compute_infer=d(count=s.model_count, ns=s.model_ns),
                compute_output=d(count=s.model_count, ns=0),
            ),
        )
    return out


def pipeline_index(names: Iterable[str]) -> list[pb.RepositoryIndexResponse.ModelIndex]:
    """The pipelines as entries of the repository index (always READY: they are YAML, not loaded models)."""
    index = pb.RepositoryIndexResponse.ModelIndex
    return [index(name=n, version=PIPELINE_VERSION, state="READY", reason="pipeline") for n in sorted(names)]
