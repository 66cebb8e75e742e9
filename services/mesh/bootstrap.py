"""Assembles the Envoy v3 bootstrap, its route files and the endpoint files of dynamic services from `istio/` and a
topology (pure: no files written)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.mesh.access_log import access_log
from services.mesh.authn import add_otlp_credential, check_jwks, ingress_jwt_rules, jwt_authn_filter, read_token
from services.mesh.authz import anonymous_paths, ingress_policies, rbac_filters
from services.mesh.clusters import cluster_members, load_assignment, render_clusters
from services.mesh.egress import check_mesh_tls, egress_cluster, egress_listener, egress_route
from services.mesh.envoyfilters import apply_patches, ingress_patches
from services.mesh.errors import MeshConfigError
from services.mesh.hosts import cluster_name
from services.mesh.listeners import EGRESS, INGRESS, hcm_of, listener, route_name, tracer_runtime, tracing
from services.mesh.loader import IstioConfig
from services.mesh.routes import Weights, gateway_virtual_services, mesh_virtual_services, route_configuration
from services.mesh.topology import IngressTls, MeshTopology, envoy_address

ADMIN_SOCKET_MODE = 0o600  # only the user running the stack may read Envoy's config_dump or change its state


@dataclass
class Rendered:
    """The bootstrap (envoy.yaml), the route configurations served from files by RDS, and the load assignments of the
    dynamic services' clusters served from files by EDS."""

    bootstrap: dict[str, Any]
    routes: dict[str, dict[str, Any]]
    endpoints: dict[str, dict[str, Any]] = field(default_factory=dict)


def render_routes(
    istio: IstioConfig, topology: MeshTopology, weights: Weights | None = None
) -> dict[str, dict[str, Any]]:
    """Route configuration name -> RouteConfiguration, for the ingress and every service's listener."""
    weights = weights or {}
    known = {c["name"] for c in render_clusters(istio, topology)}
    routes: dict[str, dict[str, Any]] = {}
    if topology.ingress is not None:
        name = route_name(INGRESS)
        routes[name] = route_configuration(name, gateway_virtual_services(istio), known, weights, None)
    for service in topology.services:
        name = route_name(service)
        vss = mesh_virtual_services(istio, service)
        routes[name] = route_configuration(name, vss, known, weights, cluster_name(service, None))
    if topology.egress is not None:
        routes[route_name(EGRESS)] = egress_route(istio, topology.egress)
    return routes


def ingress_security_filters(istio: IstioConfig, topology: MeshTopology) -> list[dict[str, Any]]:
    """jwt_authn (unless the topology turns authentication off), then the RBAC filters of the ingress policies."""
    policies = ingress_policies(istio)
    rules = ingress_jwt_rules(istio)
    check_jwks(rules, topology.jwks)
    jwt = jwt_authn_filter(rules, topology.jwks, anonymous_paths(policies)) if topology.authenticate else None
    return ([jwt] if jwt is not None else []) + rbac_filters(policies, topology.authenticate)


def ingress_tls(istio: IstioConfig, topology: MeshTopology) -> IngressTls | None:
    """The topology's certificate, for a Gateway that terminates TLS (the local ingress is one listener)."""
    if topology.ingress_tls is None:
        return None
    if not any(server.tls is not None for gw in istio.gateways for server in gw.spec.servers):
        raise MeshConfigError("topology.ingress_tls: no Gateway server of istio/ terminates TLS (tls mode SIMPLE)")
    return topology.ingress_tls


def ingress_listener(istio: IstioConfig, topology: MeshTopology, address: str, routes_dir: Path) -> dict[str, Any]:
    """The ingress gateway: TLS, authentication and authorization filters, then the EnvoyFilter patches."""
    trace = tracing(istio, topology.otlp, "meshserve-ingress")
    filters = ingress_security_filters(istio, topology)
    tls = ingress_tls(istio, topology)
    out = listener(
        INGRESS, address, routes_dir, trace, security_filters=filters, tls=tls, access=access(topology, INGRESS)
    )
    apply_patches(hcm_of(out), ingress_patches(istio))
    return out


def access(topology: MeshTopology, name: str) -> list[dict[str, Any]] | None:
    """The listener's access log to the OTLP collector, when the topology asks for one."""
    return access_log(name) if topology.otlp is not None and topology.access_log else None


def admin_address(address: str) -> dict[str, Any]:
    return envoy_address(address, ADMIN_SOCKET_MODE)


def render(
    istio: IstioConfig,
    topology: MeshTopology,
    routes_dir: Path,
    weights: Weights | None = None,
    endpoints_dir: Path | None = None,
) -> Rendered:
    """The whole Envoy configuration: admin, clusters, listeners reading their routes from `routes_dir`; the clusters
    of dynamic services read their endpoints from `endpoints_dir` (default: `endpoints` beside `routes_dir`)."""
    endpoints_dir = endpoints_dir or routes_dir.parent / "endpoints"
    listeners = []
    if topology.ingress is not None:
        listeners.append(ingress_listener(istio, topology, topology.ingress, routes_dir))
    for service, st in topology.services.items():
        trace = tracing(istio, topology.otlp, f"{service}-sidecar")
        listeners.append(listener(service, st.listen, routes_dir, trace, access=access(topology, service)))
    clusters = render_clusters(istio, topology, endpoints_dir)
    check_mesh_tls(istio)
    if topology.egress is not None:
        listeners.append(egress_listener(istio, topology, routes_dir))
        clusters.append(egress_cluster(istio, topology.egress))
    traced = any("tracing" in hcm_of(item) for item in listeners)
    if topology.otlp_token_file is not None:
        add_otlp_credential(listeners, read_token(topology.otlp_token_file))
    bootstrap: dict[str, Any] = {
        "node": {"id": topology.node_id, "cluster": "meshserve"},
        "admin": {"address": admin_address(topology.admin)},
        "static_resources": {"listeners": listeners, "clusters": clusters},
    }
    layers = [{"name": "tracer", "static_layer": tracer_runtime()}] if traced else []
    # last, so it overrides the others: runtime keys set live through the admin's POST /runtime_modify (as Istio's
    # bootstrap has it), e.g. the RuntimeFeatureFlag that turns the ingress's adaptive concurrency limit on
    bootstrap["layered_runtime"] = {"layers": [*layers, {"name": "admin", "admin_layer": {}}]}
    return Rendered(bootstrap, render_routes(istio, topology, weights), render_endpoints(istio, topology))


def render_endpoints(istio: IstioConfig, topology: MeshTopology) -> dict[str, dict[str, Any]]:
    """Cluster name -> ClusterLoadAssignment, for every cluster of every dynamic service."""
    out: dict[str, dict[str, Any]] = {}
    for service, st in topology.services.items():
        if st.dynamic:
            for name, members in cluster_members(istio, service, st.replicas).items():
                out[name] = load_assignment(name, members)
    return out
