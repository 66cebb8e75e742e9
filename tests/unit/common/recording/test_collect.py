"""A collector gathering a peer's part over the peer's admin endpoint (real HTTP on loopback) and exporting one
OTLP request."""

from __future__ import annotations

import asyncio
import json

from opentelemetry.trace import SpanKind

from services.common.recording.admin import AdminServer
from services.common.recording.collect import Collector
from services.common.recording.settings import RecordingSettings
from tests.helpers.recording import Exported, http_status
from tests.unit.common.recording.recorders import recorder


async def test_a_collector_gathers_a_peers_part_over_its_admin_endpoint() -> None:
    gateway, feature = recorder("gateway"), recorder("feature")
    peer = AdminServer(feature, "feature-id", "127.0.0.1", 0)
    port = peer.start()
    own = AdminServer(gateway, "gateway-id", "127.0.0.1", 0)
    own_port = own.start()
    settings = RecordingSettings(
        peers=[f"127.0.0.1:{port}", f"127.0.0.1:{own_port}"], collect_delay_ms=0, collect_interval_ms=0
    )
    exporter = Exported()
    collector = Collector(gateway, settings, exporter, "gateway-id")  # type: ignore[arg-type]
    gateway.edge = lambda root: ["latency"]
    try:
        with gateway.get_tracer("g").start_as_current_span("rpc", kind=SpanKind.SERVER) as root:
            # The peer's span, in the gateway's trace (as the traceparent would make it), in the peer's buffer.
            served = feature.get_tracer("f").start_span("Compute", kind=SpanKind.SERVER)
            served.end()
        assert (served.trace_id, served.parent_id) == (root.trace_id, root.span_id)
        for _ in range(100):
            await asyncio.sleep(0.02)
            if exporter.requests:
                break
        (request,) = exporter.requests
        by_service = {
            dict((kv.key, kv.value.string_value) for kv in r.resource.attributes)["service.name"]: r for r in request
        }
        assert set(by_service) == {"gateway", "feature"}  # the collector's own admin answered "self": not twice
        assert [s.name for s in by_service["feature"].scope_spans[0].spans] == ["Compute"]
        assert collector.collected == {"complete": 1, "partial": 0}
        assert feature.buffer.size == 0  # taken: a second collection would not send it again
        assert await asyncio.to_thread(http_status, f"http://127.0.0.1:{port}/metrics") == 200
        body = json.dumps({"trace_ids": ["nothex"]}).encode()
        assert await asyncio.to_thread(http_status, f"http://127.0.0.1:{port}/recording/collect", body) == 400
    finally:
        await collector.close()
        await asyncio.to_thread(peer.stop)
        await asyncio.to_thread(own.stop)
