"""The one gRPC server factory and lifecycle: interceptors, limits, health, reflection, graceful drain."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.common.interceptors import ErrorAndMetricsInterceptor
from services.common.metrics import start_metrics_server
from services.common.recording import Recorder
from services.common.settings import ServiceSettings
from services.common.tracing import RecordingRuntime, setup_tracing, shutdown_tracing

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Lifecycle:
    """What the service is doing now: readiness and draining, read by ServerLive/ServerReady-style RPCs.

    Every handler answers liveness and readiness from here, so they mean the same in every service:
    `live` is true until SIGTERM (the process serves and should not be restarted), `ready` only while health
    says SERVING (loaded, warmed and not draining).
    """

    def __init__(self) -> None:
        self.ready = False
        self.draining = False

    @property
    def live(self) -> bool:
        return not self.draining


def transport_options(settings: ServiceSettings) -> list[tuple[str, int]]:
    """Message-size limits and keepalive, for servers and for the channels a service opens to others."""
    return [
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.keepalive_time_ms", int(settings.keepalive_time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(settings.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def server_options(settings: ServiceSettings) -> list[tuple[str, int]]:
    """Server arguments: transport_options, pings allowed from Envoy's idle connections, SO_REUSEPORT."""
    return [
        *transport_options(settings),
        ("grpc.http2.min_ping_interval_without_data_ms", 5000),
        ("grpc.so_reuseport", 1 if settings.reuse_port else 0),
    ]


class GrpcService:
    """Owns one grpc.aio server: build it, add servicers, start, report health, drain on SIGTERM, stop.

    Health is NOT_SERVING until `set_serving(True)` (e.g. models loaded and warmed), and turns
    NOT_SERVING again the moment SIGTERM arrives, before in-flight requests drain.
    """

    def __init__(
        self,
        name: str,
        settings: ServiceSettings,
        service_names: Sequence[str],
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    ) -> None:
        """`interceptors` run before the shared one (e.g. a credential check that refuses before anything counts)."""
        self.name = name
        self.settings = settings
        self.service_names = list(service_names)
        self.lifecycle = Lifecycle()
        self.tracer_provider = setup_tracing(name)
        # Always-on recording (MESHSERVE_TRACING_MODE): its collector, and its admin endpoint on the metrics port.
        self.recorder = self.tracer_provider if isinstance(self.tracer_provider, Recorder) else None
        self.recording = RecordingRuntime(self.recorder) if self.recorder is not None else None
        self.server = grpc.aio.server(
            interceptors=[*interceptors, ErrorAndMetricsInterceptor(name, self.tracer_provider)],
            options=server_options(settings),
            maximum_concurrent_rpcs=settings.max_concurrent_rpcs,
        )
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            [*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server
        )
        self.port: int | None = None
        self.metrics_port: int | None = None
        self._stop = asyncio.Event()
        self.drain_hooks: list[Callable[[], None]] = []  # run when draining starts (e.g. end endless streams)

    @property
    def address(self) -> str:
        """Where the gRPC server listens: `unix:/path` with `unix_socket`, else host:port (the bound port once
        started)."""
        if self.settings.unix_socket is not None:
            return f"unix:{self.settings.unix_socket}"
        return f"{self.settings.host}:{self.port if self.port else self.settings.port}"

    async def start(self) -> int:
        """Bind and start serving (health NOT_SERVING until set_serving(True)); returns the gRPC port (0 on a Unix
        socket, which only its owner may connect to: mode 0600)."""
        await self.set_serving(False)
        address = self.address
        try:
            bound = self.server.add_insecure_port(address)
        except RuntimeError:  # grpc raises on a failed bind, or returns 0 (older releases)
            bound = 0
        if bound == 0:
            raise RuntimeError(f"{self.name}: cannot bind {address}")
        self.port = 0 if self.settings.unix_socket is not None else bound
        await self.server.start()
        if self.settings.unix_socket is not None:
            # grpc binds with the process's umask; the owner-only mode is set before the service says SERVING
            self.settings.unix_socket.chmod(0o600)
        if self.recording is not None:
            self.metrics_port = self.recording.start(self.settings.host, self.settings.metrics_port)
        else:
            self.metrics_port = start_metrics_server(self.settings.metrics_port, self.settings.host)
        log.info("%s listening on %s", self.name, self.address)
        return self.port

    async def set_serving(self, serving: bool) -> None:
        status = SERVING if serving and not self.lifecycle.draining else NOT_SERVING
        self.lifecycle.ready = status == SERVING
        for service in ("", *self.service_names):
            await self.health.set(service, status)

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)

    def request_stop(self) -> None:
        """Begin shutdown: readiness drops at once (synchronously, before any await)."""
        if not self.lifecycle.draining:
            log.info("%s: stop requested, draining", self.name)
        self.lifecycle.draining = True
        self.lifecycle.ready = False
        self._stop.set()

    async def drain(self) -> None:
        """NOT_SERVING, optional delay while still accepting, then refuse new RPCs and let in-flight finish."""
        self.lifecycle.draining = True
        await self.set_serving(False)
        for hook in self.drain_hooks:
            hook()
        if self.settings.shutdown_delay_s > 0:
            await asyncio.sleep(self.settings.shutdown_delay_s)
        await self.server.stop(self.settings.grace_period_s)
        if self.recording is not None:
            await self.recording.close()
        shutdown_tracing(self.tracer_provider)
        log.info("%s stopped", self.name)

    async def run(
        self,
        on_start: Callable[[], Awaitable[None]] | None = None,
        on_stop: Callable[[], Awaitable[None]] | None = None,
        on_serving: Callable[[], None] | None = None,
    ) -> None:
        """The whole lifecycle: start, on_start (load; then SERVING, then on_serving), wait for SIGTERM, drain,
        on_stop."""
        self.install_signal_handlers()
        await self.start()
        try:
            if on_start is not None:
                await on_start()
            if not self.lifecycle.draining:
                await self.set_serving(True)
                if on_serving is not None:
                    on_serving()
            await self._stop.wait()
        finally:
            await self.drain()
            if on_stop is not None:
                await on_stop()
