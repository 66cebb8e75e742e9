"""The floor: a bare grpc.aio Open Inference Protocol v2 server with no model, for per-request overhead."""

from __future__ import annotations

import argparse
import asyncio
import signal

import grpc

from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc
from services.protos import model_config_pb2 as mc

MAX_BATCH = 128
INPUT_NAME, INPUT_DIMS = "features", [64]
OUTPUT_NAME = "score"
_OUT = pb.ModelInferResponse.InferOutputTensor
_ZEROS = bytes(4 * MAX_BATCH)  # FP32 zeros, sliced per batch


class FloorServicer(pb_grpc.GRPCInferenceServiceServicer):
    """Answers every model name with the same fixed config and a fixed FP32 `score` per row."""

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=True)

    async def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name="meshserve-floor", version="0")

    async def ModelMetadata(self, request, context):
        t = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=request.name,
            versions=["1"],
            platform="floor",
            inputs=[t(name=INPUT_NAME, datatype="FP32", shape=[-1, *INPUT_DIMS])],
            outputs=[t(name=OUTPUT_NAME, datatype="FP32", shape=[-1, 1])],
        )

    async def ModelConfig(self, request, context):
        config = mc.ModelConfig(
            name=request.name,
            platform="floor",
            backend="floor",
            max_batch_size=MAX_BATCH,
            input=[mc.ModelInput(name=INPUT_NAME, data_type=mc.TYPE_FP32, dims=INPUT_DIMS)],
            output=[mc.ModelOutput(name=OUTPUT_NAME, data_type=mc.TYPE_FP32, dims=[1])],
        )
        return pb.ModelConfigResponse(config=config)

    async def ModelStatistics(self, request, context):
        return pb.ModelStatisticsResponse()

    async def ModelInfer(self, request, context):
        batch = request.inputs[0].shape[0] if request.inputs and request.inputs[0].shape else 1
        return pb.ModelInferResponse(
            model_name=request.model_name,
            model_version=request.model_version or "1",
            id=request.id,
            outputs=[_OUT(name=OUTPUT_NAME, datatype="FP32", shape=[batch, 1])],
            raw_output_contents=[_ZEROS[: 4 * batch] if batch <= MAX_BATCH else bytes(4 * batch)],
        )


async def serve(port: int, host: str = "127.0.0.1") -> None:
    """Serve until SIGINT/SIGTERM."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(FloorServicer(), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    print(f"floor server listening on {host}:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.host))


if __name__ == "__main__":
    main()
