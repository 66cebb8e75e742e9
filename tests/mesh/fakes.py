"""Tiny in-process gRPC replicas for mesh tests: failing, shedding, holding, forwarding and metadata-recording
servers (no stubs)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

INFER = "/inference.GRPCInferenceService/ModelInfer"


class FakeReplica:
    """A grpc server on a free loopback port whose every method is answered by `handle(method, request, context)`.

    Requests and responses stay raw bytes; grpc.health.v1 answers `serving` (settable) for the active checks.
    """

    def __init__(
        self, handle: Callable[[str, bytes, grpc.ServicerContext], bytes], serving: bool = True, workers: int = 8
    ) -> None:
        self.handle = handle
        self.calls: list[tuple[str, dict[str, str]]] = []
        # `workers` threads answer calls, health checks included: a test holding calls needs more than it holds
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
        self.health = health.HealthServicer()
        self.set_serving(serving)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.server.add_generic_rpc_handlers([_Generic(self)])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"

    def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        self.health.set("", status)

    def start(self) -> FakeReplica:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(grace=None).wait()


class _Generic(grpc.GenericRpcHandler):
    def __init__(self, replica: FakeReplica) -> None:
        self.replica = replica

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method
        if method.startswith("/grpc.health.v1."):
            return None

        def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.replica.calls.append((method, {k: v for k, v in context.invocation_metadata()}))
            return self.replica.handle(method, request, context)

        return grpc.unary_unary_rpc_method_handler(unary)


def unavailable(method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
    """Fails every call with UNAVAILABLE before any message (trailers-only: retryable by Envoy)."""
    context.abort(grpc.StatusCode.UNAVAILABLE, "fake replica: unavailable")


def echo(method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
    """Answers with an empty message (a valid, empty protobuf of any type)."""
    return b""


def forward_to(address: str) -> Callable[[str, bytes, grpc.ServicerContext], bytes]:
    """Forwards each call, bytes unchanged, to a real replica: a working replica that can then be killed."""
    channel = grpc.insecure_channel(address)

    def handle(method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        call: Any = channel.unary_unary(method)
        try:
            return call(request, timeout=5)
        except grpc.RpcError as exc:
            context.abort(exc.code(), exc.details() or "")

    return handle


PUSHBACK_MS = "73"  # not the ingress's own 50: a test tells whose pushback reached the client


def shed(method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
    """Refuses every call as a gateway's admission control does: RESOURCE_EXHAUSTED with a retry hint."""
    context.set_trailing_metadata((("grpc-retry-pushback-ms", PUSHBACK_MS),))
    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "fake gateway: busy")


class Hold:
    """A handler that keeps every call until `release()`, then answers it with an empty message."""

    def __init__(self) -> None:
        self.released = threading.Event()

    def __call__(self, method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.released.wait(30)
        return b""

    def release(self) -> None:
        self.released.set()
