"""`python -m services.traces`: receive OTLP/gRPC spans into the local SQLite trace store until SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from services.common.logs import setup_logging
from services.common.server import GrpcService
from services.traces.servicer import SERVICE_NAME, TracesServicer
from services.traces.settings import TracesSettings
from services.traces.writer import SpanWriter

log = logging.getLogger("services.traces")


async def serve(settings: TracesSettings) -> None:
    """Start the writer and the OTLP/gRPC server; at SIGTERM drain, then write what is queued and stop."""
    writer = SpanWriter(
        settings.db, settings.max_spans, settings.max_age_s, settings.batch_max_spans, settings.queue_max_spans
    )
    writer.start()
    service = GrpcService("traces", settings, [SERVICE_NAME])
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TracesServicer(writer), service.server)

    async def on_start() -> None:
        log.info("keeping up to %d spans in %s", settings.max_spans, settings.db)

    async def on_stop() -> None:
        await asyncio.to_thread(writer.close)
        log.info("wrote %d spans, rejected %d", writer.written, writer.rejected)

    await service.run(on_start, on_stop)


def main() -> None:
    # The collector never traces itself: with OTEL_EXPORTER_OTLP_ENDPOINT pointing here, it would export its own
    # Export calls to itself, forever.
    os.environ["OTEL_SDK_DISABLED"] = "true"
    settings = TracesSettings()
    setup_logging("traces", settings.log_level)
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
