"""The gRPC server interceptor the peer shims add so that perf_analyzer finds the ModelConfig call their servers lack.

MLServer and KServe both build their server with `aio.server(...)` after `from grpc import aio`;
`wrap_aio_server(module, ...)` swaps that module's `aio` for one whose `server` puts `ModelConfigInterceptor`
first. The interceptor answers `ModelConfig` with pre-serialised bytes (a Triton ModelConfigResponse written by
bench/peers/servers.py, whose path is in $BENCH_MODEL_CONFIG_FILE) and `ModelStatistics` with an empty message, and
passes every other call on. It uses grpc alone: the shims run in the peers' virtualenvs, where meshserve's
protos would clash with the peer's own `inference` package in the protobuf registry.
"""

from __future__ import annotations

import os
import types
from pathlib import Path

import grpc

CONFIG_FILE_ENV = "BENCH_MODEL_CONFIG_FILE"
MODEL_CONFIG_METHOD = "/inference.GRPCInferenceService/ModelConfig"
MODEL_STATISTICS_METHOD = "/inference.GRPCInferenceService/ModelStatistics"


def config_bytes_from_env() -> bytes:
    """The serialised ModelConfigResponse at $BENCH_MODEL_CONFIG_FILE."""
    return Path(os.environ[CONFIG_FILE_ENV]).read_bytes()


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


def wrap_aio_server(module: types.ModuleType, config_bytes: bytes, host: str | None = None) -> None:
    """Make `module.aio.server(...)` start with our interceptor; with `host`, every port it adds binds there."""
    real_server = grpc.aio.server

    def server_with_model_config(*args, interceptors=(), **kwargs):
        server = real_server(*args, interceptors=[ModelConfigInterceptor(config_bytes), *interceptors], **kwargs)
        if host is not None:
            # Servers that listen on every interface ("[::]:PORT") keep their port but stay on `host`.
            real_add = server.add_insecure_port
            server.add_insecure_port = lambda address: real_add(f"{host}:{address.rpartition(':')[2]}")
        return server

    module.aio = types.SimpleNamespace(server=server_with_model_config)  # type: ignore[attr-defined]
