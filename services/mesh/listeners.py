"""Envoy listeners: the ingress one and one outbound listener per service, routes by file-based RDS, tracing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.mesh.clusters import OTLP_CLUSTER
from services.mesh.loader import IstioConfig
from services.mesh.routes import FAULT_FILTER
from services.mesh.topology import PIPE_MODE, IngressTls, envoy_address

HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
TLS_CONTEXT = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"
INGRESS = "ingress"
EGRESS = "egress"
# What istiod gives an HTTPS Gateway server: HTTP/2 (gRPC) or HTTP/1.1 by ALPN, TLS 1.2 at least.
INGRESS_ALPN = ["h2", "http/1.1"]


def route_name(listener: str) -> str:
    return listener if listener in (INGRESS, EGRESS) else f"outbound_{listener}"


def rds_source(routes_dir: Path, name: str) -> dict[str, Any]:
    """File-based RDS: Envoy reloads the route file when a new one is renamed into the watched folder."""
    return {
        "route_config_name": name,
        "config_source": {
            "resource_api_version": "V3",
            "path_config_source": {
                "path": str(routes_dir / f"{name}.yaml"),
                "watched_directory": {"path": str(routes_dir)},
            },
        },
    }


def parent_based_sampler(percent: float) -> dict[str, Any]:
    """OpenTelemetry ParentBased(TraceIdRatioBased(percent)) sampler extension."""
    samplers = "type.googleapis.com/envoy.extensions.tracers.opentelemetry.samplers.v3"
    ratio = {"numerator": round(percent * 10_000), "denominator": "MILLION"}
    return {
        "name": "envoy.tracers.opentelemetry.samplers.parent_based",
        "typed_config": {
            "@type": f"{samplers}.ParentBasedSamplerConfig",
            "wrapped_sampler": {
                "name": "envoy.tracers.opentelemetry.samplers.trace_id_ratio_based",
                "typed_config": {"@type": f"{samplers}.TraceIdRatioBasedSamplerConfig", "sampling_percentage": ratio},
            },
        },
    }


# Envoy's OpenTelemetry tracer exports a worker's spans as soon as 5 have ended (or after 5 s): a sampled request,
# with two spans per listener it crosses, made one or two export calls to the collector while it was still on its way.
# Flushing on a timer only, as often as the services' batch span processors do (OTEL_BSP_SCHEDULE_DELAY, set by
# services.cli.stack.specs), sends each worker's spans in one call per half second: the local trace store spends far
# less CPU per request (bench/README.md, "where a lone request's time goes"), and no span waits the 5 s it could before.
TRACER_FLUSH_MS = 500
TRACER_FLUSH_SPANS = 10_000  # far above what a worker collects in a flush interval: the timer decides


def tracer_runtime() -> dict[str, int]:
    """Envoy runtime keys of its OpenTelemetry tracer's export batching (a static layer of the bootstrap)."""
    return {
        "tracing.opentelemetry.flush_interval_ms": TRACER_FLUSH_MS,
        "tracing.opentelemetry.min_flush_spans": TRACER_FLUSH_SPANS,
    }


def tracing(istio: IstioConfig, otlp: str | None, service_name: str) -> dict[str, Any] | None:
    """Telemetry tracing to the OpenTelemetry tracer; None when there is no collector or no tracing resource."""
    if otlp is None:
        return None
    for telemetry in istio.telemetries:
        for t in telemetry.spec.tracing:
            if t.disable_span_reporting:
                continue
            percent = 1.0 if t.random_sampling_percentage is None else t.random_sampling_percentage
            return {
                # Envoy's own decision samples everything; the OTel sampler decides: an incoming sampled or
                # unsampled `traceparent` is honoured, a new trace is sampled at randomSamplingPercentage.
                "random_sampling": {"value": 100.0},
                "spawn_upstream_span": True,
                "provider": {
                    "name": "envoy.tracers.opentelemetry",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig",
                        "grpc_service": {"envoy_grpc": {"cluster_name": OTLP_CLUSTER}, "timeout": "1s"},
                        "service_name": service_name,
                        "sampler": parent_based_sampler(percent),
                    },
                },
            }
    return None


def downstream_tls(tls: IngressTls) -> dict[str, Any]:
    """The TLS server of the ingress (a Gateway server with tls mode SIMPLE), its certificate read from files."""
    certificate = {
        "certificate_chain": {"filename": str(tls.cert_chain)},
        "private_key": {"filename": str(tls.private_key)},
    }
    context = {
        "@type": TLS_CONTEXT,
        "common_tls_context": {
            "tls_params": {"tls_minimum_protocol_version": "TLSv1_2"},
            "alpn_protocols": list(INGRESS_ALPN),
            "tls_certificates": [certificate],
        },
    }
    return {"name": "envoy.transport_sockets.tls", "typed_config": context}


def hcm_of(listener: dict[str, Any]) -> dict[str, Any]:
    """The HttpConnectionManager config of a listener rendered by `listener()`."""
    config: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return config


def listener(
    name: str,
    address: str,
    routes_dir: Path,
    trace: dict[str, Any] | None,
    *,
    security_filters: list[dict[str, Any]] | None = None,
    tls: IngressTls | None = None,
    access: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A listener on `address` (host:port, or unix:/abs/path: a socket of mode 0600) whose HTTP filters are
    `security_filters` (jwt_authn, RBAC), fault injection, the router."""
    hcm: dict[str, Any] = {
        "@type": HCM,
        "stat_prefix": name,
        "codec_type": "AUTO",
        "rds": rds_source(routes_dir, route_name(name)),
        "http_filters": [
            *(security_filters or []),
            {
                "name": FAULT_FILTER,
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault"},
            },
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
            },
        ],
    }
    if trace is not None:
        hcm["tracing"] = trace
    if access:
        hcm["access_log"] = access
    chain: dict[str, Any] = {
        "filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]
    }
    if tls is not None:
        chain["transport_socket"] = downstream_tls(tls)
    return {
        "name": name,
        "address": envoy_address(address, PIPE_MODE),
        "filter_chains": [chain],
    }
