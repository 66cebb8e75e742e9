"""`python -m services.traces [--ui-port PORT] [--ui-host HOST]`: receive OTLP/gRPC spans into the local SQLite trace
store until SIGTERM, and serve the trace UI over it when given a UI port (flag or MESHSERVE_TRACES_UI_PORT); with
MESHSERVE_TRACES_RECORDING_PORT, also keep Envoy's access log records for retroactive collection."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from services.common.internal_auth import InternalAuthInterceptor, internal_token
from services.common.logs import setup_logging
from services.common.server import GrpcService
from services.traces.access_logs import SERVICE_NAME as LOGS_SERVICE_NAME
from services.traces.access_logs import AccessLogAdmin, AccessLogServicer
from services.traces.access_spans import AccessLogBuffer
from services.traces.servicer import SERVICE_NAME, TracesServicer
from services.traces.settings import TracesSettings
from services.traces.web import TraceUI
from services.traces.writer import SpanWriter

log = logging.getLogger("services.traces")


class TraceStoreParts:
    """What runs beside the trace store's gRPC server: the span writer its OTLP servicer hands spans to, the UI (with
    a UI port) and the access-log endpoint with its buffer (with a recording port). `start` once the server
    listens; `close` after it drained writes what is queued and stops them."""

    def __init__(self, settings: TracesSettings) -> None:
        self.settings = settings
        # The UI binds first, so that a taken port fails the start before anything runs.
        self.ui = None
        if settings.ui_port is not None:
            token = settings.ui_token.get_secret_value() or None
            self.ui = TraceUI(settings.db, settings.ui_host, settings.ui_port, token)
        self.writer = SpanWriter(
            settings.db, settings.max_spans, settings.max_age_s, settings.batch_max_spans, settings.queue_max_spans
        )
        self.buffer: AccessLogBuffer | None = None
        self.access: AccessLogAdmin | None = None
        if settings.recording_port is not None:
            self.buffer = AccessLogBuffer(settings.recording_max_records)
            self.access = AccessLogAdmin(self.buffer, settings.host, settings.recording_port)

    async def start(self) -> None:
        settings = self.settings
        self.writer.start()
        log.info("keeping up to %d spans in %s", settings.max_spans, settings.db)
        if self.ui is not None:
            self.ui.start()
            log.info("trace UI at %s (its token lets the browser in)", self.ui.login_url)
        if self.access is not None:
            port = self.access.start()
            log.info("access log records for retroactive collection on http://%s:%d", settings.host, port)

    async def close(self) -> None:
        if self.access is not None:
            await asyncio.to_thread(self.access.stop)
        if self.ui is not None:
            await asyncio.to_thread(self.ui.stop)
        await asyncio.to_thread(self.writer.close)
        log.info("wrote %d spans, rejected %d", self.writer.written, self.writer.rejected)


def build(settings: TracesSettings) -> tuple[GrpcService, TraceStoreParts]:
    """The server with the OTLP TraceService on the span writer, and the LogsService for Envoy's access log when
    the settings have a recording port; and the parts that run beside it. With the internal credential
    (MESHSERVE_INTERNAL_TOKEN) every call but health needs it (UNAUTHENTICATED otherwise)."""
    parts = TraceStoreParts(settings)
    names = [SERVICE_NAME] + ([LOGS_SERVICE_NAME] if parts.buffer is not None else [])
    token = internal_token()  # Export (spans, Envoy's access logs) only from the stack's processes, when it has one
    service = GrpcService("traces", settings, names, interceptors=[InternalAuthInterceptor(token)] if token else [])
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TracesServicer(parts.writer), service.server)
    if parts.buffer is not None:
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(AccessLogServicer(parts.buffer), service.server)
    return service, parts


async def serve(settings: TracesSettings) -> None:
    """Build, then serve until SIGTERM: drain, then write what is queued and stop."""
    service, parts = build(settings)
    await service.run(parts.start, parts.close)


def parse_args(argv: list[str] | None = None) -> dict[str, object]:
    """The flags given, as settings fields (flags override the environment)."""
    parser = argparse.ArgumentParser(prog="python -m services.traces", description=__doc__)
    parser.add_argument("--ui-port", type=int, help="serve the trace UI on this port (0: a free one)")
    parser.add_argument("--ui-host", help="address the UI binds (default 127.0.0.1)")
    args = parser.parse_args(argv)
    return {k: v for k, v in {"ui_port": args.ui_port, "ui_host": args.ui_host}.items() if v is not None}


def main(argv: list[str] | None = None) -> None:
    overrides = parse_args(argv)
    # The collector never traces itself: with OTEL_EXPORTER_OTLP_ENDPOINT pointing here, it would export its own
    # Export calls to itself, forever.
    os.environ["OTEL_SDK_DISABLED"] = "true"
    settings = TracesSettings(**overrides)  # type: ignore[arg-type]
    setup_logging("traces", settings.log_level)
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
