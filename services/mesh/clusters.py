"""DestinationRules and the topology to Envoy clusters: subsets, load balancer, connection pool, outlier detection,
endpoints fixed in the bootstrap or read from files (EDS)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.mesh.durations import envoy_duration, parse_duration
from services.mesh.errors import MeshConfigError
from services.mesh.hosts import cluster_name, service_of
from services.mesh.istio import DestinationRule, OutlierDetection, TrafficPolicy
from services.mesh.loader import IstioConfig
from services.mesh.topology import HealthCheck, MeshEndpoint, MeshTopology, envoy_address, split_address

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
    """An LbEndpoint at the replica's address: a SocketAddress, or a Pipe for a replica on a Unix socket."""
    return {"endpoint": {"address": envoy_address(replica.address)}}


def load_assignment(name: str, replicas: list[MeshEndpoint]) -> dict[str, Any]:
    """The ClusterLoadAssignment of a cluster: inline for a static cluster, the resource of an endpoint file for EDS."""
    return {"cluster_name": name, "endpoints": [{"lb_endpoints": [endpoint(r) for r in replicas]}]}


def endpoints_file(endpoints_dir: Path, name: str) -> Path:
    """Where the EDS file of cluster `name` lives (a cluster name is a file name: no '/', no leading '.')."""
    if "/" in name or name.startswith(".") or "\0" in name:
        raise MeshConfigError(f"cluster '{name}': not usable as an endpoint file name (a service name with '/'?)")
    return endpoints_dir / f"{name}.yaml"


def eds_cluster_config(endpoints_dir: Path, name: str) -> dict[str, Any]:
    """File-based EDS: Envoy reloads the endpoint file when a new one is renamed into the watched folder."""
    return {
        "eds_config": {
            "resource_api_version": "V3",
            "path_config_source": {
                "path": str(endpoints_file(endpoints_dir, name)),
                "watched_directory": {"path": str(endpoints_dir)},
            },
        }
    }


def outlier_detection(od: OutlierDetection) -> dict[str, Any]:
    """Istio's translation: each consecutive counter set is enforced at 100%, success-rate ejection is off (for
    local-origin failures too, when they are counted apart)."""
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
    if od.split_external_local_origin_errors:
        out["split_external_local_origin_errors"] = True
        if od.consecutive_local_origin_failures:
            out["consecutive_local_origin_failure"] = od.consecutive_local_origin_failures
            out["enforcing_consecutive_local_origin_failure"] = 100
        out["enforcing_local_origin_success_rate"] = 0
    return out


def health_checks(hc: HealthCheck, dynamic: bool = False) -> list[dict[str, Any]]:
    """Active grpc.health.v1 checks; a dynamic cluster checks hosts that are not healthy every `unhealthy_interval`
    (traffic or not), healthy ones as a static cluster does."""
    check: dict[str, Any] = {
        "timeout": envoy_duration(parse_duration(hc.timeout)),
        "interval": envoy_duration(parse_duration(hc.interval)),
        "no_traffic_interval": envoy_duration(parse_duration(hc.no_traffic_interval)),
        "unhealthy_threshold": hc.unhealthy_threshold,
        "healthy_threshold": hc.healthy_threshold,
        "grpc_health_check": {"service_name": hc.service_name},
    }
    if dynamic:
        unhealthy = envoy_duration(parse_duration(hc.unhealthy_interval))
        check["no_traffic_healthy_interval"] = check["no_traffic_interval"]
        check["no_traffic_interval"] = unhealthy
        check["unhealthy_interval"] = unhealthy
    return [check]


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


def cluster(
    name: str,
    replicas: list[MeshEndpoint],
    policy: TrafficPolicy,
    hc: HealthCheck | None,
    endpoints_dir: Path | None = None,
) -> dict[str, Any]:
    """One Envoy cluster (a subset, or the whole service) speaking HTTP/2 to its replicas.

    With `endpoints_dir` the cluster is dynamic: EDS from its endpoint file there, health-checked even while it has no
    endpoint (so a host added later is checked at once), and a host removed from the file leaves at once.
    """
    lb = LB_POLICIES[policy.load_balancer.simple] if policy.load_balancer else "LEAST_REQUEST"
    tcp = policy.connection_pool.tcp if policy.connection_pool else None
    http = policy.connection_pool.http if policy.connection_pool else None
    out: dict[str, Any] = {
        "name": name,
        "type": "STATIC" if endpoints_dir is None else "EDS",
        "connect_timeout": envoy_duration(parse_duration(tcp.connect_timeout) if tcp and tcp.connect_timeout else 10),
        "lb_policy": lb,
    }
    if endpoints_dir is None:
        out["load_assignment"] = load_assignment(name, replicas)
    else:
        out["eds_cluster_config"] = eds_cluster_config(endpoints_dir, name)
        out["ignore_health_on_host_removal"] = True
    out["typed_extension_protocol_options"] = http2_options(policy)
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
    if hc is not None and (replicas or endpoints_dir is not None):
        out["health_checks"] = health_checks(hc, dynamic=endpoints_dir is not None)
    if endpoints_dir is not None:
        # Envoy holds health changes back for a 1 s merge window by default: an added host that passed its first
        # check would stay out of rotation that long. Membership changes themselves are never merged.
        out.setdefault("common_lb_config", {})["update_merge_window"] = "0s"
    return out


def matches(labels: dict[str, str], selector: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def service_clusters(
    rule: DestinationRule | None, service: str, replicas: list[MeshEndpoint]
) -> list[tuple[str, list[MeshEndpoint], TrafficPolicy]]:
    """(cluster name, its replicas, its policy) of a service: the whole service, then each DestinationRule subset with
    the replicas whose labels match it."""
    base = rule.spec.traffic_policy if rule else None
    out = [(cluster_name(service, None), list(replicas), merge_policy(base, None))]
    for subset in rule.spec.subsets if rule else []:
        members = [r for r in replicas if matches(r.labels, subset.labels)]
        out.append((cluster_name(service, subset.name), members, merge_policy(base, subset.traffic_policy)))
    return out


def cluster_members(istio: IstioConfig, service: str, replicas: list[MeshEndpoint]) -> dict[str, list[MeshEndpoint]]:
    """Cluster name -> the replicas it balances over, for every cluster of `service` given these replicas."""
    rule = destination_rules_by_service(istio).get(service)
    return {name: members for name, members, _ in service_clusters(rule, service, replicas)}


def render_clusters(
    istio: IstioConfig, topology: MeshTopology, endpoints_dir: Path = Path("endpoints")
) -> list[dict[str, Any]]:
    """A cluster per service (all replicas) and per DestinationRule subset (replicas whose labels match); the clusters
    of a dynamic service read their endpoints from files in `endpoints_dir`."""
    rules = destination_rules_by_service(istio)  # rules for services not in the topology are not rendered
    clusters: list[dict[str, Any]] = []
    for service, st in topology.services.items():
        eds = endpoints_dir if st.dynamic else None
        for name, members, policy in service_clusters(rules.get(service), service, st.replicas):
            clusters.append(cluster(name, members, policy, topology.health_check, eds))
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
