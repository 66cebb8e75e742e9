"""Envoy's OpenTelemetry access log of every request (start, durations, status, the trace context it came with),
sent to the OTLP collector's LogsService, so that retroactive tracing can rebuild Envoy's spans of a kept request
that Envoy did not sample (services/traces/access_spans.py reads the records)."""

from __future__ import annotations

from typing import Any

from services.mesh.clusters import OTLP_CLUSTER

LOGGER = "envoy.access_loggers.open_telemetry"
LOGGER_TYPE = "type.googleapis.com/envoy.extensions.access_loggers.open_telemetry.v3.OpenTelemetryAccessLogConfig"
LOG_NAME = "meshserve.access"
# Records reach the collector within this (Envoy's default: 1 s), before the retroactive collection of a kept trace
# (about 0.3 s after the gateway's answer) asks for them.
FLUSH_INTERVAL = "0.1s"

# The attribute keys of a record (services/traces/access_spans.py parses them) and Envoy's command operators.
ATTRIBUTES = {
    "listener": None,  # the listener's name, set per listener
    "trace_id": "%TRACE_ID%",
    "traceparent": "%REQ(TRACEPARENT)%",
    "via": "%REQ(X-MESHSERVE-PARENT)%",
    "start": "%START_TIME(%s.%9f)%",
    "duration_us": "%COMMON_DURATION(DS_RX_BEG:DS_TX_END:us)%",
    "upstream_start_us": "%COMMON_DURATION(DS_RX_BEG:US_TX_BEG:us)%",
    "upstream_end_us": "%COMMON_DURATION(DS_RX_BEG:US_RX_END:us)%",
    "path": "%REQ(:PATH)%",
    "response_code": "%RESPONSE_CODE%",
    "grpc_status": "%GRPC_STATUS_NUMBER%",
    "response_flags": "%RESPONSE_FLAGS%",
    "upstream_cluster": "%UPSTREAM_CLUSTER%",
    "upstream_host": "%UPSTREAM_HOST%",
}


def access_log(listener: str) -> list[dict[str, Any]]:
    """The HCM `access_log` of one listener: every request, as one OTLP log record of ATTRIBUTES."""
    values = [
        {"key": key, "value": {"string_value": listener if operator is None else operator}}
        for key, operator in ATTRIBUTES.items()
    ]
    return [
        {
            "name": LOGGER,
            "typed_config": {
                "@type": LOGGER_TYPE,
                "grpc_service": {"envoy_grpc": {"cluster_name": OTLP_CLUSTER}, "timeout": "1s"},
                "log_name": LOG_NAME,
                "buffer_flush_interval": FLUSH_INTERVAL,
                "attributes": {"values": values},
            },
        }
    ]
