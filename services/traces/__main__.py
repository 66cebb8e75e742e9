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


async def serve(settings: TracesSettings) -> None:
    """Start the writer, the UI (with a UI port) and the OTLP/gRPC server; at SIGTERM drain, then write what is
    queued and stop."""
    # The UI binds first, so that a taken port fails the start before anything runs.
    ui = TraceUI(settings.db, settings.ui_host, settings.ui_port) if settings.ui_port is not None else None
    writer = SpanWriter(
        settings.db, settings.max_spans, settings.max_age_s, settings.batch_max_spans, settings.queue_max_spans
    )
    writer.start()
    names = [SERVICE_NAME] + ([LOGS_SERVICE_NAME] if settings.recording_port is not None else [])
    service = GrpcService("traces", settings, names)
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TracesServicer(writer), service.server)
    access: AccessLogAdmin | None = None
    if settings.recording_port is not None:
        buffer = AccessLogBuffer(settings.recording_max_records)
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(AccessLogServicer(buffer), service.server)
        access = AccessLogAdmin(buffer, settings.host, settings.recording_port)

    async def on_start() -> None:
        log.info("keeping up to %d spans in %s", settings.max_spans, settings.db)
        if ui is not None:
            ui.start()
            log.info("trace UI at %s", ui.url)
        if access is not None:
            access.start()
            log.info("access log records for retroactive collection on http://%s:%d", settings.host, access.port)

    async def on_stop() -> None:
        if access is not None:
            await asyncio.to_thread(access.stop)
        if ui is not None:
            await asyncio.to_thread(ui.stop)
        await asyncio.to_thread(writer.close)
        log.info("wrote %d spans, rejected %d", writer.written, writer.rejected)

    await service.run(on_start, on_stop)


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
