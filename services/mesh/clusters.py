"""DestinationRules and the topology to Envoy clusters: subsets, load balancer, connection pool, outlier detection."""

from __future__ import annotations

from typing import Any

from services.mesh.durations import envoy_duration, parse_duration
from services.mesh.errors import MeshConfigError
from services.mesh.hosts import cluster_name, service_of
from services.mesh.istio import DestinationRule, OutlierDetection, TrafficPolicy
from services.mesh.loader import IstioConfig
from services.mesh.topology import HealthCheck, MeshEndpoint, MeshTopology, split_address

HTTP_PROTOCOL_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
LB_POLICIES = {
    "UNSPECIFIED": "LEAST_REQUEST",  # Istio's default
    "LEAST_REQUEST": "LEAST_REQUEST",
    "LEAST_CONN": "LEAST_REQUEST",  # deprecated Istio alias
    "ROUND_ROBIN": "ROUND_ROBIN",
    "RANDOM": "RANDOM",
    "PASSTHROUGH": "CLUSTER_PROVIDED",
}
OTLP_CLUSTER = "opentelemetry_collector"


def destination_rules_by_service(istio: IstioConfig) -> dict[str, DestinationRule]:
    out: dict[str, DestinationRule] = {}
    for dr in istio.destination_rules:
        service = service_of(dr.spec.host)
        if service in out:
            raise MeshConfigError(
                f"{dr.source}: DestinationRule '{dr.metadata.name}': spec.host: '{dr.spec.host}' already has "
                f"DestinationRule '{out[service].metadata.name}' ({out[service].source})"
            )
        out[service] = dr
    return out


def merge_policy(base: TrafficPolicy | None, override: TrafficPolicy | None) -> TrafficPolicy:
    """A subset's trafficPolicy replaces the top-level one field group by field group (as Istio does)."""
    merged = (base or TrafficPolicy()).model_copy()
    if override is not None:
        for name in TrafficPolicy.model_fields:
            value = getattr(override, name)
            if value is not None:
                setattr(merged, name, value)
    return merged


def endpoint(replica: MeshEndpoint) -> dict[str, Any]:
    host, port = split_address(replica.address)
    return {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}


def outlier_detection(od: OutlierDetection) -> dict[str, Any]:
    """Istio's translation: each consecutive counter set is enforced at 100%, success-rate ejection is off."""
    out: dict[str, Any] = {"enforcing_success_rate": 0}
    if od.consecutive_gateway_errors is not None:
        out["consecutive_gateway_failure"] = od.consecutive_gateway_errors
        out["enforcing_consecutive_gateway_failure"] = 100 if od.consecutive_gateway_errors else 0
    if od.consecutive_5xx_errors is not None:
        out["consecutive_5xx"] = od.consecutive_5xx_errors
        out["enforcing_consecutive_5xx"] = 100 if od.consecutive_5xx_errors else 0
    else:
        out["enforcing_consecutive_5xx"] = 0
    if od.interval is not None:
        out["interval"] = envoy_duration(parse_duration(od.interval))
    if od.base_ejection_time is not None:
        out["base_ejection_time"] = envoy_duration(parse_duration(od.base_ejection_time))
    if od.max_ejection_percent is not None:
        out["max_ejection_percent"] = od.max_ejection_percent
    return out


def health_checks(hc: HealthCheck) -> list[dict[str, Any]]:
    return [
        {
            "timeout": envoy_duration(parse_duration(hc.timeout)),
            "interval": envoy_duration(parse_duration(hc.interval)),
            "no_traffic_interval": envoy_duration(parse_duration(hc.no_traffic_interval)),
            "unhealthy_threshold": hc.unhealthy_threshold,
            "healthy_threshold": hc.healthy_threshold,
            "grpc_health_check": {"service_name": hc.service_name},
        }
    ]


def http2_options(policy: TrafficPolicy) -> dict[str, Any]:
    options: dict[str, Any] = {"@type": f"type.googleapis.com/{HTTP_PROTOCOL_OPTIONS}"}
    options["explicit_http_config"] = {"http2_protocol_options": {}}
    http = policy.connection_pool.http if policy.connection_pool else None
    common: dict[str, Any] = {}
    if http is not None and http.max_requests_per_connection:
        common["max_requests_per_connection"] = http.max_requests_per_connection
    if http is not None and http.idle_timeout is not None:
        common["idle_timeout"] = envoy_duration(parse_duration(http.idle_timeout))
    if common:
        options["common_http_protocol_options"] = common
    return {HTTP_PROTOCOL_OPTIONS: options}


def cluster(name: str, replicas: list[MeshEndpoint], policy: TrafficPolicy, hc: HealthCheck | None) -> dict[str, Any]:
    """One Envoy cluster (a subset, or the whole service) speaking HTTP/2 to its replicas."""
    lb = LB_POLICIES[policy.load_balancer.simple] if policy.load_balancer else "LEAST_REQUEST"
    tcp = policy.connection_pool.tcp if policy.connection_pool else None
    http = policy.connection_pool.http if policy.connection_pool else None
    out: dict[str, Any] = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": envoy_duration(parse_duration(tcp.connect_timeout) if tcp and tcp.connect_timeout else 10),
        "lb_policy": lb,
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [endpoint(r) for r in replicas]}]},
        "typed_extension_protocol_options": http2_options(policy),
    }
    thresholds: dict[str, Any] = {}
    if tcp is not None and tcp.max_connections is not None:
        thresholds["max_connections"] = tcp.max_connections
    if http is not None:
        for istio_field, envoy_field in (
            ("http1_max_pending_requests", "max_pending_requests"),
            ("http2_max_requests", "max_requests"),
            ("max_retries", "max_retries"),
        ):
            if getattr(http, istio_field) is not None:
                thresholds[envoy_field] = getattr(http, istio_field)
    if thresholds:
        out["circuit_breakers"] = {"thresholds": [thresholds]}
    if policy.outlier_detection is not None:
        out["outlier_detection"] = outlier_detection(policy.outlier_detection)
        panic = policy.outlier_detection.min_health_percent or 0  # Istio: no panic routing unless asked
        out["common_lb_config"] = {"healthy_panic_threshold": {"value": panic}}
    if hc is not None and replicas:
        out["health_checks"] = health_checks(hc)
    return out


def matches(labels: dict[str, str], selector: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def render_clusters(istio: IstioConfig, topology: MeshTopology) -> list[dict[str, Any]]:
    """A cluster per service (all replicas) and per DestinationRule subset (replicas whose labels match)."""
    rules = destination_rules_by_service(istio)  # rules for services not in the topology are not rendered
    clusters: list[dict[str, Any]] = []
    for service, st in topology.services.items():
        dr = rules.get(service)
        base = dr.spec.traffic_policy if dr else None
        clusters.append(
            cluster(cluster_name(service, None), st.replicas, merge_policy(base, None), topology.health_check)
        )
        for subset in dr.spec.subsets if dr else []:
            members = [r for r in st.replicas if matches(r.labels, subset.labels)]
            policy = merge_policy(base, subset.traffic_policy)
            clusters.append(cluster(cluster_name(service, subset.name), members, policy, topology.health_check))
    if topology.otlp is not None:
        clusters.append(otlp_cluster(topology.otlp))
    return clusters


def otlp_cluster(address: str) -> dict[str, Any]:
    host, port = split_address(address)
    return {
        "name": OTLP_CLUSTER,
        "type": "STRICT_DNS" if not host.replace(".", "").isdigit() else "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": OTLP_CLUSTER,
            "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}]}
            ],
        },
        "typed_extension_protocol_options": http2_options(TrafficPolicy()),
    }
