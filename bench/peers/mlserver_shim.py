"""Runs inside MLServer's own virtualenv: a TorchScript runtime and a launcher that answers ModelConfig.

MLServer has no `ModelConfig` RPC, which perf_analyzer needs before it sends a request. The launcher
adds bench.peers.config_interceptor's interceptor to the server mlserver.grpc.server builds (it answers that
one call with the pre-serialised bytes at $BENCH_MODEL_CONFIG_FILE) and then starts MLServer exactly as
`mlserver start FOLDER` does. Nothing here imports meshserve's protos: they would clash with MLServer's own `inference`
package in the protobuf registry.

    python -m bench.peers.mlserver_shim FOLDER
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri

from bench.peers.config_interceptor import config_bytes_from_env, wrap_aio_server


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


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m bench.peers.mlserver_shim FOLDER")
    import mlserver.grpc.server as mlserver_grpc
    from mlserver.cli.main import main as mlserver_main

    wrap_aio_server(mlserver_grpc, config_bytes_from_env())
    sys.argv = ["mlserver", "start", sys.argv[1]]
    mlserver_main()


if __name__ == "__main__":
    main()
