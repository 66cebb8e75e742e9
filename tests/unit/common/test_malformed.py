"""Bodies that do not parse: the tolerant deserializer's Malformed value and the rate-limited log line."""

from __future__ import annotations

import logging

import pytest
from grpc_health.v1 import health_pb2

from services.common.malformed import Malformed, RateLimitedLog, message_type_of, tolerant


def test_a_tolerant_deserializer_parses_or_says_what_failed() -> None:
    parse = tolerant(health_pb2.HealthCheckRequest.FromString)
    assert parse is not None
    assert parse(b"\x0a\x02ok") == health_pb2.HealthCheckRequest(service="ok")
    bad = parse(b"\xff" * 16)
    assert isinstance(bad, Malformed) and bad.size == 16 and bad.error.startswith("DecodeError")
    assert bad.description == "the request body is not a valid grpc.health.v1.HealthCheckRequest"
    assert tolerant(None) is None  # no deserializer: the handler gets the raw bytes
    assert message_type_of(lambda data: data) == "message"


def test_one_line_per_key_and_interval_then_the_count_left_out(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    limited = RateLimitedLog(interval_s=10.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="services.common.malformed")
    assert limited.warning("/a", "bad body for %s", "/a")
    assert not any(limited.warning("/a", "bad body for %s", "/a") for _ in range(41))
    assert limited.warning("/b", "bad body for %s", "/b")  # another method has its own allowance
    now[0] += 9.9
    assert not limited.warning("/a", "bad body for %s", "/a")
    now[0] += 0.2
    assert limited.warning("/a", "bad body for %s", "/a")
    assert [r.getMessage() for r in caplog.records] == [
        "bad body for /a",
        "bad body for /b",
        "bad body for /a (and 42 more since the last such line)",
    ]
