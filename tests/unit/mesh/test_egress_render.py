"""The edge tier's egress and the cloud tier's DENY as rendered from istio/edge and istio/cloud: routes keyed on the
data-class header, the WAN delay, TLS to the cloud ingress, and the refusals of what the local mesh cannot render."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from services.mesh.bootstrap import render, render_routes
from services.mesh.egress import is_ip
from services.mesh.errors import MeshConfigError
from services.mesh.listeners import hcm_of
from services.mesh.loader import load_istio
from services.mesh.routes import FAULT_FILTER
from services.mesh.topology import Egress, MeshService, MeshTopology
from tests.unit.mesh.conftest import ISTIO, dr, topology, vs

EDGE = ISTIO / "edge"
CLOUD = ISTIO / "cloud"
HOST = "cloud.meshserve.example"
CLUSTER = f"outbound|grpc||{HOST}"
HEADER = "x-meshserve-data-class"
ALWAYS = {"numerator": 1_000_000, "denominator": "MILLION"}


def egress(**fields: Any) -> Egress:
    return Egress(**{"listen": "127.0.0.1:18090", "cloud_ingress": "127.0.0.1:18443", **fields})


def rendered(paths: list[Path], **topo: Any) -> dict[str, Any]:
    return render(load_istio(paths), topology(**topo), Path("/tmp/routes")).bootstrap


def named(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (item,) = [i for i in items if i["name"] == name]
    return item


def egress_routes(paths: list[Path] | None = None, **fields: Any) -> list[dict[str, Any]]:
    routes = render_routes(load_istio(paths or [ISTIO, EDGE]), topology(egress=egress(**fields)))
    route: list[dict[str, Any]] = routes["egress"]["virtual_hosts"][0]["routes"]
    return route


def first_match(routes: list[dict[str, Any]], headers: dict[str, str]) -> dict[str, Any]:
    """The route Envoy picks for a request with these headers (first match wins; only exact header matches here)."""
    for route in routes:
        wanted = route["match"].get("headers", [])
        if all(headers.get(h["name"]) == h["string_match"]["exact"] for h in wanted):
            return route
    raise AssertionError(f"no route for {headers}")


def test_without_egress_the_edge_resources_change_nothing() -> None:
    assert rendered([ISTIO, EDGE]) == rendered([ISTIO])
    assert "egress" not in render_routes(load_istio([ISTIO, EDGE]), topology())


def test_the_egress_listener_has_the_fault_filter_before_the_router() -> None:
    bootstrap = rendered([ISTIO, EDGE], egress=egress())
    listener = named(bootstrap["static_resources"]["listeners"], "egress")
    assert listener["address"] == {"socket_address": {"address": "127.0.0.1", "port_value": 18090}}
    hcm = hcm_of(listener)
    assert [f["name"] for f in hcm["http_filters"]] == [FAULT_FILTER, "envoy.filters.http.router"]
    assert hcm["rds"]["route_config_name"] == "egress"
    (mapper,) = hcm["local_reply_config"]["mappers"]  # an abort says why, not "fault filter abort"
    assert mapper["filter"] == {"response_flag_filter": {"flags": ["FI"]}}
    assert "x-meshserve-data-class" in mapper["body"]["inline_string"]


def test_sensitive_and_unclassified_requests_are_refused_at_the_egress_and_general_ones_delayed() -> None:
    routes = egress_routes()
    for headers in ({HEADER: "sensitive"}, {}, {HEADER: "secret"}, {HEADER: "General"}):
        fault = first_match(routes, headers)["typed_per_filter_config"][FAULT_FILTER]
        assert fault["abort"] == {"percentage": ALWAYS, "http_status": 403}, headers
        assert "delay" not in fault
    general = first_match(routes, {HEADER: "general"})
    assert general["route"]["cluster"] == CLUSTER
    fault = general["typed_per_filter_config"][FAULT_FILTER]
    assert fault["delay"] == {"fixed_delay": "0.03s", "percentage": ALWAYS} and "abort" not in fault
    assert "retry_policy" not in general["route"]  # the edge gateway falls back, the mesh does not retry over the WAN


def test_every_way_out_but_the_general_one_aborts() -> None:
    """Whatever order the routes come in: a route that reaches the cloud without aborting asks for `general`."""
    for route in egress_routes():
        fault = route.get("typed_per_filter_config", {}).get(FAULT_FILTER, {})
        if "abort" not in fault:
            assert route["match"]["headers"] == [{"name": HEADER, "string_match": {"exact": "general"}}]


def test_the_cloud_cluster_originates_tls_to_the_ingress(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    bootstrap = rendered([ISTIO, EDGE], egress=egress(cloud_ingress="localhost:18443", tls_ca=ca))
    cluster = named(bootstrap["static_resources"]["clusters"], CLUSTER)
    assert cluster["type"] == "STRICT_DNS"
    assert cluster["connect_timeout"] == "1s"
    assert "health_checks" not in cluster
    address = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
    assert address == {"socket_address": {"address": "localhost", "port_value": 18443}}
    tls = cluster["transport_socket"]["typed_config"]
    assert tls["sni"] == "localhost"
    context = tls["common_tls_context"]
    assert context["alpn_protocols"] == ["h2"]
    assert context["validation_context"] == {
        "trusted_ca": {"filename": str(ca)},
        "match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"exact": "localhost"}}],
    }


def test_an_ip_ingress_is_verified_by_ip_and_gets_no_sni(tmp_path: Path) -> None:
    bootstrap = rendered([ISTIO, EDGE], egress=egress(tls_ca=tmp_path / "ca.pem"))
    cluster = named(bootstrap["static_resources"]["clusters"], CLUSTER)
    assert cluster["type"] == "STATIC"
    tls = cluster["transport_socket"]["typed_config"]
    assert "sni" not in tls
    san = tls["common_tls_context"]["validation_context"]["match_typed_subject_alt_names"]
    assert san == [{"san_type": "IP_ADDRESS", "matcher": {"exact": "127.0.0.1"}}]
    named_server = rendered([ISTIO, EDGE], egress=egress(tls_ca=tmp_path / "ca.pem", tls_server_name="cloud.local"))
    tls = named(named_server["static_resources"]["clusters"], CLUSTER)["transport_socket"]["typed_config"]
    assert tls["sni"] == "cloud.local"


def test_without_a_ca_the_local_cloud_ingress_is_plaintext() -> None:
    cluster = named(rendered([ISTIO, EDGE], egress=egress())["static_resources"]["clusters"], CLUSTER)
    assert "transport_socket" not in cluster


def service_entry(*hosts: str, ports: list[int] | None = None, name: str = "cloud") -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": name},
        "spec": {
            "hosts": list(hosts),
            "location": "MESH_EXTERNAL",
            "ports": [{"number": p, "name": f"grpc-{p}", "protocol": "GRPC"} for p in ports or [80]],
        },
    }


def to_host(host: str, port: int = 80) -> list[dict[str, Any]]:
    return [{"route": [{"destination": {"host": host, "port": {"number": port}}}]}]


def test_refusals_name_the_field(write_yaml: Any, tmp_path: Path) -> None:
    two = write_yaml("two.yaml", service_entry("a.example", name="a"), service_entry("b.example", name="b"))
    with pytest.raises(MeshConfigError, match=r"topology.egress.host: istio/ has 2 ServiceEntry hosts"):
        egress_routes([ISTIO, two])
    with pytest.raises(MeshConfigError, match=r"no ServiceEntry of istio/ has host 'c\.example'"):
        egress_routes([ISTIO, two], host="c.example")
    bare = write_yaml("bare.yaml", service_entry("a.example"))
    with pytest.raises(MeshConfigError, match=r"no VirtualService for host 'a\.example'"):
        egress_routes([ISTIO, bare])
    port = write_yaml("port.yaml", service_entry("a.example"), vs(to_host("a.example", 443), hosts=["a.example"]))
    with pytest.raises(MeshConfigError, match=r"spec.http.0.route.0.destination.port: 443 is not a port"):
        egress_routes([ISTIO, port])
    plaintext = write_yaml("plain.yaml", service_entry("a.example"), vs(to_host("a.example"), hosts=["a.example"]))
    assert egress_routes([ISTIO, plaintext])[0]["route"]["cluster"] == "outbound|grpc||a.example"
    with pytest.raises(MeshConfigError, match=r"topology.egress.tls_ca: the DestinationRule of host 'a.example'"):
        rendered([ISTIO, plaintext], egress=egress(tls_ca=tmp_path / "ca.pem"))


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"tls": {"mode": "ISTIO_MUTUAL"}}, r"tls.mode: ISTIO_MUTUAL"),
        (
            {"loadBalancer": {"localityLbSetting": {"enabled": True, "failover": [{"from": "a", "to": "b"}]}}},
            "localityLbSetting.failover: field not supported",
        ),
    ],
)
def test_rules_the_egress_cannot_keep_are_refused(write_yaml: Any, policy: dict[str, Any], message: str) -> None:
    path = write_yaml(
        "rule.yaml",
        service_entry("a.example"),
        vs(to_host("a.example"), hosts=["a.example"]),
        dr({"host": "a.example", "trafficPolicy": policy}, name="a"),
    )
    with pytest.raises(MeshConfigError, match=message):
        rendered([ISTIO, path], egress=egress())


def test_tls_to_a_mesh_service_is_refused(write_yaml: Any) -> None:
    def with_tls(mode: str) -> dict[str, Any]:
        subsets = [{"name": v, "labels": {"version": v}} for v in ("v1", "v2")]
        return dr({"host": "model", "trafficPolicy": {"tls": {"mode": mode}}, "subsets": subsets})

    path = write_yaml("tls.yaml", with_tls("SIMPLE"))
    with pytest.raises(MeshConfigError, match=r"DestinationRule 'model': spec.trafficPolicy.tls.mode: SIMPLE"):
        rendered([ISTIO, path])
    rendered([ISTIO, write_yaml("mtls.yaml", with_tls("ISTIO_MUTUAL"))])  # sidecar mTLS: not applicable locally


def test_a_service_named_egress_is_refused_with_an_egress() -> None:
    MeshTopology(services={"egress": MeshService(listen="127.0.0.1:1")})
    with pytest.raises(ValidationError, match="share a listener name"):
        MeshTopology(services={"egress": MeshService(listen="127.0.0.1:1")}, egress=egress())


# -- the cloud tier's ingress --------------------------------------------------------------------------------


def rbac(paths: list[Path]) -> dict[str, dict[str, Any]]:
    listener = named(rendered(paths, ingress="127.0.0.1:18080")["static_resources"]["listeners"], "ingress")
    return {
        f["typed_config"]["rules"]["action"]: f["typed_config"]["rules"]["policies"]
        for f in hcm_of(listener)["http_filters"]
        if f["name"] == "envoy.filters.http.rbac"
    }


def test_the_cloud_ingress_denies_the_sensitive_class() -> None:
    deny = rbac([ISTIO, CLOUD])["DENY"]
    assert deny["ns[istio-system]-policy[ingress-deny-sensitive]-rule[0]"] == {
        "permissions": [{"and_rules": {"rules": [{"any": True}]}}],
        "principals": [{"and_ids": {"ids": [{"header": {"name": HEADER, "string_match": {"exact": "sensitive"}}}]}}],
    }
    assert set(rbac([ISTIO])["DENY"]) < set(deny)  # the single tier's policies are all still there


def condition_policy(when: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "p", "namespace": "istio-system"},
        "spec": {"selector": {"matchLabels": {"istio": "ingressgateway"}}, "action": "DENY", "rules": [{"when": when}]},
    }


def test_conditions_on_headers_as_istiod_renders_them(write_yaml: Any) -> None:
    path = write_yaml(
        "p.yaml",
        condition_policy(
            [
                {"key": "request.headers[X-Tier]", "values": ["edge", "*-cloud"]},
                {"key": "request.headers[x-class]", "notValues": ["*"]},
            ]
        ),
    )
    ids = rbac([ISTIO, path])["DENY"]["ns[istio-system]-policy[p]-rule[0]"]["principals"][0]["and_ids"]["ids"]
    assert ids == [
        {
            "or_ids": {
                "ids": [
                    {"header": {"name": "x-tier", "string_match": {"exact": "edge"}}},
                    {"header": {"name": "x-tier", "string_match": {"suffix": "-cloud"}}},
                ]
            }
        },
        {"not_id": {"header": {"name": "x-class", "present_match": True}}},
    ]


@pytest.mark.parametrize(
    ("when", "message"),
    [
        ([{"key": "source.ip", "values": ["10.0.0.1"]}], r"when.0.key: 'source.ip': only request.headers"),
        ([{"key": "request.headers[x]"}], r"when.0: needs values or notValues"),
    ],
)
def test_conditions_the_ingress_cannot_check_are_refused(
    write_yaml: Any, when: list[dict[str, Any]], message: str
) -> None:
    path = write_yaml("p.yaml", condition_policy(when))
    with pytest.raises(MeshConfigError, match=message):
        rbac([ISTIO, path])


@pytest.mark.parametrize(
    ("host", "ip"), [("127.0.0.1", True), ("::1", True), ("cloud.meshserve.example", False), ("localhost", False)]
)
def test_an_ip_is_told_from_a_host_name(host: str, ip: bool) -> None:
    """A cloud ingress named by IP needs `tls_server_name` for TLS checks; one named by host is checked by name."""
    assert is_ip(host) is ip
