"""The edge tier's egress: a loopback listener routed by the VirtualServices of a ServiceEntry host (the cloud tier's
ingress), and the cluster that reaches that ingress, over TLS when the host's DestinationRule originates it.

What crosses is decided by the routes of istio/edge (by the `x-meshserve-data-class` header), rendered as every other
VirtualService is: a fault abort answers at the egress itself (the request never leaves the machine), a fault delay
stands in for the WAN. Without a VirtualService for the host the egress is refused: a way out that does not look at
the data class would let anything out.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from services.mesh.access_log import access_log
from services.mesh.clusters import cluster, destination_rules_by_service, merge_policy
from services.mesh.errors import MeshConfigError
from services.mesh.hosts import cluster_name, service_of
from services.mesh.istio import DestinationRule, ServiceEntry, TrafficPolicy, VirtualService
from services.mesh.listeners import EGRESS, hcm_of, listener, route_name, tracing
from services.mesh.loader import IstioConfig
from services.mesh.routes import route_configuration
from services.mesh.topology import Egress, MeshEndpoint, MeshTopology, split_address

UPSTREAM_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
ORIGINATING_MODES = ("SIMPLE",)


def egress_entry(istio: IstioConfig, egress: Egress) -> tuple[ServiceEntry, str]:
    """The ServiceEntry and host the egress leads to: `egress.host`, or the only ServiceEntry host of istio/."""
    entries = {host: entry for entry in istio.service_entries for host in entry.spec.hosts}
    if egress.host is None:
        if len(entries) != 1:
            raise MeshConfigError(
                f"topology.egress.host: istio/ has {len(entries)} ServiceEntry hosts {sorted(entries)}; name the one "
                "the egress leads to"
            )
        host = next(iter(entries))
    else:
        host = egress.host
        if host not in entries:
            raise MeshConfigError(f"topology.egress.host: no ServiceEntry of istio/ has host '{host}'")
    return entries[host], host


def egress_virtual_services(istio: IstioConfig, host: str) -> list[VirtualService]:
    """VirtualServices on `host` that apply to calls from inside the mesh (no gateways, or `mesh` among them)."""
    return [
        vs
        for vs in istio.virtual_services
        if host in vs.spec.hosts and (not vs.spec.gateways or "mesh" in vs.spec.gateways)
    ]


def egress_rule(istio: IstioConfig, host: str) -> DestinationRule | None:
    """The host's DestinationRule, checked for what the local egress can render."""
    rule = destination_rules_by_service(istio).get(service_of(host))
    if rule is None:
        return None
    where = f"{rule.source}: DestinationRule '{rule.metadata.name}'"
    if rule.spec.subsets:
        raise MeshConfigError(f"{where}: spec.subsets: an external host has no pods to pick by label")
    tls = rule.spec.traffic_policy.tls if rule.spec.traffic_policy else None
    if tls is not None and tls.mode not in ("DISABLE", *ORIGINATING_MODES):
        raise MeshConfigError(
            f"{where}: spec.trafficPolicy.tls.mode: {tls.mode}: the egress originates SIMPLE TLS to an external "
            "ingress (or none)"
        )
    return rule


def check_mesh_tls(istio: IstioConfig) -> None:
    """MeshConfigError for a DestinationRule of a mesh service that asks for TLS the local services cannot speak:
    ISTIO_MUTUAL (sidecar mTLS) does not apply locally; SIMPLE or MUTUAL would mean the service terminates TLS."""
    external = {host for entry in istio.service_entries for host in entry.spec.hosts}
    for rule in istio.destination_rules:
        tls = rule.spec.traffic_policy.tls if rule.spec.traffic_policy else None
        if rule.spec.host not in external and tls is not None and tls.mode in ("SIMPLE", "MUTUAL"):
            raise MeshConfigError(
                f"{rule.source}: DestinationRule '{rule.metadata.name}': spec.trafficPolicy.tls.mode: {tls.mode}: "
                "the local services speak plaintext; only the egress to a ServiceEntry host originates TLS"
            )


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def upstream_tls(ca: Path, server_name: str) -> dict[str, Any]:
    """TLS to the cloud ingress: its certificate must chain to `ca` and name `server_name` (sent as SNI); h2 by ALPN."""
    san = {"san_type": "IP_ADDRESS" if is_ip(server_name) else "DNS", "matcher": {"exact": server_name.strip("[]")}}
    context: dict[str, Any] = {
        "@type": UPSTREAM_TLS,
        "common_tls_context": {
            "tls_params": {"tls_minimum_protocol_version": "TLSv1_2"},
            "alpn_protocols": ["h2"],
            "validation_context": {"trusted_ca": {"filename": str(ca)}, "match_typed_subject_alt_names": [san]},
        },
    }
    if not is_ip(server_name):  # SNI carries host names only (RFC 6066)
        context["sni"] = server_name
    return {"name": "envoy.transport_sockets.tls", "typed_config": context}


def egress_cluster(istio: IstioConfig, egress: Egress) -> dict[str, Any]:
    """The cluster of the ServiceEntry host: the cloud ingress address, the DestinationRule's connection pool and
    outlier detection, no active health checks (the edge gateway's deadline and fallback decide), TLS as the rule
    says when the topology gives the CA."""
    _, host = egress_entry(istio, egress)
    rule = egress_rule(istio, host)
    policy: TrafficPolicy = merge_policy(rule.spec.traffic_policy if rule else None, None)
    out = cluster(cluster_name(host, None), [MeshEndpoint(address=egress.cloud_ingress)], policy, None)
    address, _ = split_address(egress.cloud_ingress)
    if not is_ip(address):
        out["type"] = "STRICT_DNS"
        out["dns_lookup_family"] = "V4_PREFERRED"
    if egress.tls_ca is not None:
        if policy.tls is None or policy.tls.mode not in ORIGINATING_MODES:
            raise MeshConfigError(
                f"topology.egress.tls_ca: the DestinationRule of host '{host}' does not originate TLS (tls mode SIMPLE)"
            )
        out["transport_socket"] = upstream_tls(egress.tls_ca, egress.tls_server_name or address)
    return out


def egress_route(istio: IstioConfig, egress: Egress) -> dict[str, Any]:
    """The egress listener's RouteConfiguration: the host's VirtualService routes, each destination checked to be the
    ServiceEntry host on one of its ports."""
    entry, host = egress_entry(istio, egress)
    vss = egress_virtual_services(istio, host)
    if not vss:
        raise MeshConfigError(
            f"topology.egress: no VirtualService for host '{host}' in istio/ (the egress routes by data class)"
        )
    ports = {p.number for p in entry.spec.ports}
    for vs in vss:
        for i, route in enumerate(vs.spec.http):
            for j, rd in enumerate(route.route):
                port = rd.destination.port
                if rd.destination.host == host and port is not None and port.number not in ports:
                    raise MeshConfigError(
                        f"{vs.source}: VirtualService '{vs.metadata.name}': spec.http.{i}.route.{j}.destination.port: "
                        f"{port.number} is not a port of ServiceEntry '{entry.metadata.name}' {sorted(ports)}"
                    )
    return route_configuration(route_name(EGRESS), vss, {cluster_name(host, None)}, {}, None)


REFUSED = "meshserve egress: this request's data class (x-meshserve-data-class) may not leave this tier"


def refusal_message() -> dict[str, Any]:
    """A local reply mapper: an aborted request (response flag FI) says why, in its grpc-message or body."""
    return {"mappers": [{"filter": {"response_flag_filter": {"flags": ["FI"]}}, "body": {"inline_string": REFUSED}}]}


def egress_listener(istio: IstioConfig, topology: MeshTopology, routes_dir: Path) -> dict[str, Any]:
    """The loopback listener the edge gateway calls the cloud at (MESHSERVE_GATEWAY_CLOUD_URL)."""
    assert topology.egress is not None
    trace = tracing(istio, topology.otlp, "meshserve-egress")
    access = access_log(EGRESS) if topology.otlp is not None and topology.access_log else None
    out = listener(EGRESS, topology.egress.listen, routes_dir, trace, access=access)
    hcm_of(out)["local_reply_config"] = refusal_message()
    return out
