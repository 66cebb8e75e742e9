"""A collector that goes away before its answer is written costs the admin endpoint one warning line, no traceback
(real HTTP on loopback)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import socket

import pytest

from services.common.recording.admin import AdminServer
from tests.unit.common.recording.recorders import recorder

SPANS = 1_000
PAYLOAD = "x" * 2_000  # about 2 MB of spans: far more than one write, so the answer cannot reach the socket whole


async def test_a_collector_gone_before_the_answer_is_one_warning_line(caplog: pytest.LogCaptureFixture) -> None:
    feature = recorder("feature", capacity=SPANS + 10)
    tracer = feature.get_tracer("f")
    with tracer.start_as_current_span("Compute") as root:
        for i in range(SPANS - 1):
            tracer.start_span(f"part {i}", attributes={"payload": PAYLOAD}).end()
    peer = AdminServer(feature, "feature-id", "127.0.0.1", 0)
    port = peer.start()
    body = json.dumps({"trace_ids": [f"{root.get_span_context().trace_id:032x}"], "collector": "gateway-id"})
    request = (
        f"POST /recording/collect HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    ).encode()
    stderr = io.StringIO()
    caplog.set_level(logging.INFO)
    try:
        with contextlib.redirect_stderr(stderr):
            # Sent and closed while this event loop, which holds the buffer, is busy here: the answer can only be
            # written after the collector has gone.
            with socket.create_connection(("127.0.0.1", port)) as client:
                client.sendall(request)
            for _ in range(250):
                await asyncio.sleep(0.02)
                if caplog.records:
                    break
            await asyncio.sleep(0.1)  # anything more it would log
        assert "Traceback" not in stderr.getvalue(), stderr.getvalue()
        assert "Exception occurred" not in stderr.getvalue(), stderr.getvalue()
        (record,) = caplog.records
        assert record.levelno == logging.WARNING and record.exc_info is None
        message = record.getMessage()
        assert "\n" not in message and message.startswith("admin endpoint: 127.0.0.1:"), message
        assert "went away during POST /recording/collect" in message, message
        assert feature.buffer.size == 0  # the request was served: only its answer was lost
    finally:
        await asyncio.to_thread(peer.stop)
