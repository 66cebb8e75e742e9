"""Runs inside KServe's own virtualenv: a TorchScript file as a `kserve.Model` behind KServe's own ModelServer.

KServe's gRPC server (Open Inference Protocol v2) has no `ModelConfig` RPC, which perf_analyzer needs before it
sends a request. The launcher adds bench.peers.config_interceptor's interceptor to the grpc.aio server that
kserve.protocol.grpc.server builds (it answers that call with the pre-serialised bytes at
$BENCH_MODEL_CONFIG_FILE), keeps that server on loopback, and starts `kserve.ModelServer` as KServe's own model
servers do: every flag but --model_settings is KServe's (--grpc_port, --http_port, --enable_latency_logging, ...),
read by kserve.model_server's parser. Nothing here imports meshserve's protos: they would clash with KServe's own
`inference` package in the protobuf registry.

    python -m bench.peers.kserve_shim --model_settings FILE --model_name NAME --grpc_port P --http_port H [KServe flags]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer, model_server
from kserve.protocol.grpc import server as kserve_grpc
from kserve.protocol.rest import server as kserve_rest

from bench.peers.config_interceptor import config_bytes_from_env, wrap_aio_server

LOOPBACK = "127.0.0.1"


class TorchScriptModel(Model):
    """Loads a TorchScript file and runs it on the first input ([batch, 64] FP32) -> `score` [batch, 1]."""

    def __init__(self, settings: dict[str, Any]) -> None:
        super().__init__(settings["name"])
        self.version = str(settings["version"])
        self.model_file = Path(settings["model_file"])
        self.inputs = settings["inputs"]
        self.outputs = settings["outputs"]

    def load(self) -> bool:
        self._model = torch.jit.load(str(self.model_file), map_location="cpu").eval()
        with torch.inference_mode():
            self._model(torch.zeros(1, *self.inputs[0]["shape"][1:]))
        self.ready = True
        return self.ready

    def get_input_types(self) -> list[dict[str, Any]]:
        return self.inputs

    def get_output_types(self) -> list[dict[str, Any]]:
        return self.outputs

    def predict(self, payload: InferRequest, headers: dict[str, str] | None = None) -> InferResponse:
        # Not async: kserve.Model.__call__ runs a plain predict inline on the server's event loop.
        # A copy: as_numpy() views the read-only request bytes, which torch.from_numpy warns about.
        features = np.array(payload.inputs[0].as_numpy(), dtype=np.float32)
        with torch.inference_mode():
            scores = self._model(torch.from_numpy(features)).numpy()
        output = InferOutput(name=self.outputs[0]["name"], shape=list(scores.shape), datatype="FP32")
        output.set_data_from_numpy(scores, binary_data=True)
        return InferResponse(
            response_id=payload.id, model_name=self.name, model_version=self.version, infer_outputs=[output]
        )


def _rest_on_loopback() -> None:
    """KServe always starts its REST server too, on 0.0.0.0: keep it on loopback."""
    real_init = kserve_rest.RESTServer.__init__

    def init_on_loopback(self, *args, **kwargs) -> None:
        real_init(self, *args, **kwargs)
        self.config.host = LOOPBACK

    kserve_rest.RESTServer.__init__ = init_on_loopback


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.kserve_shim", parents=[model_server.parser])
    parser.add_argument("--model_settings", type=Path, required=True, help="JSON written by bench/peers/servers.py")
    args, _ = parser.parse_known_args()
    settings = json.loads(args.model_settings.read_text())
    wrap_aio_server(kserve_grpc, config_bytes_from_env(), host=LOOPBACK)
    _rest_on_loopback()
    model = TorchScriptModel(settings)
    model.load()
    ModelServer().start([model])


if __name__ == "__main__":
    main()
