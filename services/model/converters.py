"""Protobuf <-> domain conversions for the model service's v2 RPCs (no logic beyond the mapping)."""

from __future__ import annotations

from collections.abc import Sequence

from services.common.tensor_codec import decode_request_inputs, encode_raw
from services.common.triton_config import MODEL_CONFIG_DATA_TYPES
from services.model.config import ModelConfig
from services.model.domain import InferenceRequest, InferenceResponse, ModelMetadata, ServerMetadata
from services.model.manager import RepositoryEntry
from services.model.stats import Duration, VersionStats
from services.model.version import ModelVersion
from services.protos import inference_pb2 as pb
from services.protos import model_config_pb2 as mc


def infer_request_from_pb(request: pb.ModelInferRequest) -> InferenceRequest:
    return InferenceRequest(
        model_name=request.model_name,
        model_version=request.model_version,
        inputs=decode_request_inputs(request.inputs, request.raw_input_contents),
        id=request.id,
        requested_outputs=[o.name for o in request.outputs],
    )


def infer_response_to_pb(response: InferenceResponse) -> pb.ModelInferResponse:
    """Outputs travel as raw_output_contents, as Triton sends them."""
    message = pb.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    for name, array in response.outputs.items():
        datatype, shape, raw = encode_raw(array)
        message.outputs.add(name=name, datatype=datatype, shape=shape)
        message.raw_output_contents.append(raw)
    return message


def server_metadata_to_pb(metadata: ServerMetadata) -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(name=metadata.name, version=metadata.version, extensions=metadata.extensions)


def _shape(config: ModelConfig, dims: list[int]) -> list[int]:
    """Tensor shape as the v2 protocol reports it: -1 for the batch dimension of a batched model."""
    return [-1, *dims] if config.max_batch_size > 0 else list(dims)


def metadata_to_pb(metadata: ModelMetadata) -> pb.ModelMetadataResponse:
    mv = metadata.version
    config = mv.config
    tensor = pb.ModelMetadataResponse.TensorMetadata
    return pb.ModelMetadataResponse(
        name=config.name,
        versions=[str(v) for v in metadata.ready_versions],
        platform=mv.platform,
        inputs=[tensor(name=s.name, datatype=s.datatype, shape=_shape(config, s.dims)) for s in config.inputs],
        outputs=[tensor(name=s.name, datatype=s.datatype, shape=_shape(config, s.dims)) for s in config.outputs],
    )


def config_to_pb(mv: ModelVersion) -> mc.ModelConfig:
    """Triton's model-config message, as perf_analyzer and tritonclient expect it."""
    config = mv.config
    message = mc.ModelConfig(
        name=config.name,
        platform=mv.platform,
        backend=mv.triton_backend,
        max_batch_size=config.max_batch_size,
        input=[
            mc.ModelInput(name=s.name, data_type=MODEL_CONFIG_DATA_TYPES[s.datatype], dims=s.dims)
            for s in config.inputs
        ],
        output=[
            mc.ModelOutput(name=s.name, data_type=MODEL_CONFIG_DATA_TYPES[s.datatype], dims=s.dims)
            for s in config.outputs
        ],
        instance_group=[
            mc.ModelInstanceGroup(
                name=config.name,
                count=config.instance_count,
                kind=mc.ModelInstanceGroup.KIND_GPU
                if mv.model.device.startswith("cuda")
                else mc.ModelInstanceGroup.KIND_CPU,
            )
        ],
    )
    policy = config.version_policy
    if policy.all is not None:
        message.version_policy.all.SetInParent()
    elif policy.specific is not None:
        message.version_policy.specific.versions.extend(policy.specific.versions)
    else:
        message.version_policy.latest.num_versions = policy.latest.num_versions if policy.latest else 1
    batching = config.dynamic_batching
    if batching is not None:
        message.dynamic_batching.preferred_batch_size.extend(batching.preferred_batch_sizes)
        message.dynamic_batching.max_queue_delay_microseconds = batching.max_queue_delay_us
        message.dynamic_batching.default_queue_policy.max_queue_size = batching.max_queue_size
    quantization = config.optimization_for(mv.version).quantization
    message.parameters["quantization"].string_value = quantization
    message.parameters["execution"].string_value = mv.execution
    return message


def config_response_to_pb(mv: ModelVersion) -> pb.ModelConfigResponse:
    return pb.ModelConfigResponse(config=config_to_pb(mv))


def _duration(d: Duration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=d.count, ns=d.ns)


def version_statistics_to_pb(stats: VersionStats) -> pb.ModelStatistics:
    return pb.ModelStatistics(
        name=stats.model,
        version=str(stats.version),
        last_inference=stats.last_inference_ms,
        inference_count=stats.inference_count,
        execution_count=stats.execution_count,
        inference_stats=pb.InferStatistics(
            success=_duration(stats.success),
            fail=_duration(stats.fail),
            queue=_duration(stats.queue),
            compute_input=_duration(stats.compute_input),
            compute_infer=_duration(stats.compute_infer),
            compute_output=_duration(stats.compute_output),
        ),
        batch_stats=[
            pb.InferBatchStatistics(
                batch_size=size,
                compute_input=_duration(b.compute_input),
                compute_infer=_duration(b.compute_infer),
                compute_output=_duration(b.compute_output),
            )
            for size, b in sorted(stats.batches.items())
        ],
    )


def statistics_to_pb(versions: Sequence[VersionStats]) -> pb.ModelStatisticsResponse:
    return pb.ModelStatisticsResponse(model_stats=[version_statistics_to_pb(stats) for stats in versions])


def repository_index_to_pb(entries: Sequence[RepositoryEntry]) -> pb.RepositoryIndexResponse:
    index = pb.RepositoryIndexResponse.ModelIndex
    return pb.RepositoryIndexResponse(
        models=[index(name=e.name, version=e.version, state=e.state, reason=e.reason) for e in entries]
    )
