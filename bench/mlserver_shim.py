"""Runs inside MLServer's own virtualenv: a TorchScript runtime and a launcher that answers ModelConfig.

MLServer has no `ModelConfig` RPC, which perf_analyzer needs before it sends a request. The launcher
adds a gRPC server interceptor that answers that one call with pre-serialised bytes (a Triton
ModelConfigResponse written by bench/peers.py, whose path is in $BENCH_MODEL_CONFIG_FILE) and then
starts MLServer exactly as `mlserver start FOLDER` does. Nothing here imports meshserve's protos: they
would clash with MLServer's own `inference` package in the protobuf registry.

    python -m bench.mlserver_shim FOLDER
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import grpc
import numpy as np
import torch
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri

MODEL_CONFIG_METHOD = "/inference.GRPCInferenceService/ModelConfig"
MODEL_STATISTICS_METHOD = "/inference.GRPCInferenceService/ModelStatistics"


class TorchScriptRuntime(MLModel):
    """Loads a TorchScript file (parameters.uri) and runs it on the first input: [batch, 64] -> score."""

    async def load(self) -> bool:
        uri = await get_model_uri(self._settings)
        self._model = torch.jit.load(uri, map_location="cpu").eval()
        with torch.inference_mode():
            self._model(torch.zeros(1, 64))
        self.ready = True
        return self.ready

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        features = NumpyCodec.decode_input(payload.inputs[0])
        with torch.inference_mode():
            scores = self._model(torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32)))
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            outputs=[NumpyCodec.encode_output("score", scores.numpy())],
        )


class ModelConfigInterceptor(grpc.aio.ServerInterceptor):
    """Answers ModelConfig (and an empty ModelStatistics) with fixed bytes; passes everything else on."""

    def __init__(self, config_bytes: bytes) -> None:
        async def model_config(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return config_bytes

        async def model_statistics(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return b""

        # No (de)serialisers: the handlers see and return raw bytes.
        self._handlers = {
            MODEL_CONFIG_METHOD: grpc.unary_unary_rpc_method_handler(model_config),
            MODEL_STATISTICS_METHOD: grpc.unary_unary_rpc_method_handler(model_statistics),
        }

    async def intercept_service(self, continuation, handler_call_details):
        handler = self._handlers.get(handler_call_details.method)
        if handler is not None:
            return handler
        return await continuation(handler_call_details)


def install_interceptor(config_bytes: bytes) -> None:
    """Make MLServer's gRPC server (mlserver.grpc.server uses `aio.server`) start with our interceptor."""
    import mlserver.grpc.server as mlserver_grpc

    real_server = grpc.aio.server

    def server_with_model_config(*args, interceptors=(), **kwargs):
        return real_server(*args, interceptors=[ModelConfigInterceptor(config_bytes), *interceptors], **kwargs)

    mlserver_grpc.aio = types.SimpleNamespace(server=server_with_model_config)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m bench.mlserver_shim FOLDER")
    install_interceptor(Path(os.environ["BENCH_MODEL_CONFIG_FILE"]).read_bytes())
    from mlserver.cli.main import main as mlserver_main

    sys.argv = ["mlserver", "start", sys.argv[1]]
    mlserver_main()


if __name__ == "__main__":
    main()
