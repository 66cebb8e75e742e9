"""Assembles the Envoy v3 bootstrap and its route files from `istio/` and a topology (pure: no files written)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.mesh.clusters import render_clusters
from services.mesh.hosts import cluster_name
from services.mesh.listeners import INGRESS, listener, route_name, tracer_runtime, tracing
from services.mesh.loader import IstioConfig
from services.mesh.routes import Weights, gateway_virtual_services, mesh_virtual_services, route_configuration
from services.mesh.topology import MeshTopology, split_address


@dataclass
class Rendered:
    """The bootstrap (envoy.yaml) and the route configurations served from files by RDS."""

    bootstrap: dict[str, Any]
    routes: dict[str, dict[str, Any]]


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
    return routes


def render(istio: IstioConfig, topology: MeshTopology, routes_dir: Path, weights: Weights | None = None) -> Rendered:
    """The whole Envoy configuration: admin, clusters, listeners reading their routes from `routes_dir`."""
    listeners = []
    traced = False
    names = [(service, st.listen, f"{service}-sidecar") for service, st in topology.services.items()]
    if topology.ingress is not None:
        names.insert(0, (INGRESS, topology.ingress, "meshserve-ingress"))
    for name, address, service_name in names:
        trace = tracing(istio, topology.otlp, service_name)
        traced = traced or trace is not None
        listeners.append(listener(name, address, routes_dir, trace))
    admin_host, admin_port = split_address(topology.admin)
    bootstrap: dict[str, Any] = {
        "node": {"id": topology.node_id, "cluster": "meshserve"},
        "admin": {"address": {"socket_address": {"address": admin_host, "port_value": admin_port}}},
        "static_resources": {"listeners": listeners, "clusters": render_clusters(istio, topology)},
    }
    if traced:
        bootstrap["layered_runtime"] = {"layers": [{"name": "tracer", "static_layer": tracer_runtime()}]}
    return Rendered(bootstrap, render_routes(istio, topology, weights))
