"""In-process grpc.aio replicas for mesh tests under load: one with a fixed capacity (calls beyond its slots queue, so
its latency grows with the load it is given), and one that can freeze (accepts calls, health checks included, and
never answers them: a SIGSTOPped process as its peers see it)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

HEALTH_CHECK = "/grpc.health.v1.Health/Check"

Handler = Callable[[str, bytes, grpc.aio.ServicerContext], Awaitable[bytes]]


class AioReplica:
    """A grpc.aio server on a free loopback port, run by its own event loop in a daemon thread.

    Every unary method (grpc.health.v1 Check included) is answered by `handle(method, request, context)`; requests
    and responses stay raw bytes. `received` counts the calls that arrived, by method.
    """

    def __init__(self, handle: Handler) -> None:
        self.handle = handle
        self.received: Counter[str] = Counter()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server: grpc.aio.Server = self.run(self._make_server())
        self.port = self.run(self._port())
        self.address = f"127.0.0.1:{self.port}"

    def run(self, coro: Awaitable[Any]) -> Any:
        """Run a coroutine on the replica's loop and wait for its result."""
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]
        return future.result(10)

    async def _make_server(self) -> grpc.aio.Server:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers([_Generic(self)])
        return server

    async def _port(self) -> int:
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return port

    def stop(self) -> None:
        self.run(self.server.stop(grace=None))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


class _Generic(grpc.GenericRpcHandler):
    def __init__(self, replica: AioReplica) -> None:
        self.replica = replica

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method
        replica = self.replica

        async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            replica.received[method] += 1
            return await replica.handle(method, request, context)

        return grpc.unary_unary_rpc_method_handler(unary)


SERVING = health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING).SerializeToString()


class Capacity:
    """A handler with `slots` calls served at once, each taking `service_s`; the others wait their turn, so that past
    `slots / service_s` calls per second the latency grows with the queue (a server at its capacity). Health checks
    are answered at once."""

    def __init__(self, slots: int, service_s: float) -> None:
        self.slots = slots
        self.service_s = service_s
        self._semaphore: asyncio.Semaphore | None = None

    async def __call__(self, method: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if method == HEALTH_CHECK:
            return SERVING
        if self._semaphore is None:  # made on the replica's loop
            self._semaphore = asyncio.Semaphore(self.slots)
        async with self._semaphore:
            await asyncio.sleep(self.service_s)
        return b""


class Freezable:
    """Answers every call after `service_s` (health checks at once) until `freeze()`; from then on every call, health
    checks included, waits forever: the connection stays open and accepts streams, as a stopped process's does."""

    def __init__(self, service_s: float = 0.002) -> None:
        self.service_s = service_s
        self.frozen = threading.Event()

    def freeze(self) -> None:
        self.frozen.set()

    async def __call__(self, method: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if self.frozen.is_set():
            await asyncio.Event().wait()  # never set: the caller's deadline or Envoy's timeout ends the call
        if method == HEALTH_CHECK:
            return SERVING
        await asyncio.sleep(self.service_s)
        return b""
