"""The renderer's parts on their own: host names, retry policies, traffic-policy merging, samplers, route files."""

from __future__ import annotations

from pathlib import Path

import yaml

from services.mesh.clusters import merge_policy, outlier_detection
from services.mesh.files import ROUTE_TYPE, write_route
from services.mesh.hosts import cluster_name, service_of
from services.mesh.istio import HTTPRetry, LoadBalancerSettings, OutlierDetection, TrafficPolicy
from services.mesh.listeners import parent_based_sampler, route_name
from services.mesh.routes import GRPC_CODES, default_retry_policy, parse_retry_on, retry_policy


def test_istio_hosts_name_local_services_and_clusters() -> None:
    for host in ("model", "model.meshserve", "model.meshserve.svc", "model.meshserve.svc.cluster.local"):
        assert service_of(host) == "model"
    assert service_of("model.other.svc.cluster.local") == "model.other.svc.cluster.local"
    assert cluster_name("model", "v2") == "outbound|grpc|v2|model"
    assert cluster_name("model", None) == "outbound|grpc||model"


def test_retry_policy_follows_istios_convert_policy() -> None:
    assert retry_policy(None) == default_retry_policy()
    assert retry_policy(HTTPRetry(attempts=0)) is None
    assert retry_policy(HTTPRetry(attempts=3))["num_retries"] == 3
    assert parse_retry_on("5xx, 503 ,gateway-error,,429") == ("5xx,gateway-error", [503, 429])
    assert default_retry_policy() is not default_retry_policy()  # a fresh copy: callers may change theirs


def test_grpc_status_names_are_the_grpc_codes() -> None:
    assert GRPC_CODES["UNAVAILABLE"] == 14 and GRPC_CODES["RESOURCE_EXHAUSTED"] == 8 and len(GRPC_CODES) == 17


def test_a_subset_policy_replaces_field_groups_of_the_top_level_one() -> None:
    base = TrafficPolicy(
        load_balancer=LoadBalancerSettings(simple="ROUND_ROBIN"),
        outlier_detection=OutlierDetection(consecutive_gateway_errors=3),
    )
    merged = merge_policy(base, TrafficPolicy(load_balancer=LoadBalancerSettings(simple="RANDOM")))
    assert merged.load_balancer is not None and merged.load_balancer.simple == "RANDOM"
    assert merged.outlier_detection == base.outlier_detection
    assert base.load_balancer is not None and base.load_balancer.simple == "ROUND_ROBIN"  # the base is not changed
    assert merge_policy(None, None) == TrafficPolicy()


def test_outlier_detection_enforces_each_counter_it_sets() -> None:
    assert outlier_detection(OutlierDetection(consecutive_5xx_errors=0)) == {
        "enforcing_success_rate": 0,
        "consecutive_5xx": 0,
        "enforcing_consecutive_5xx": 0,
    }


def test_listener_route_names_and_sampler() -> None:
    assert (route_name("ingress"), route_name("model")) == ("ingress", "outbound_model")
    sampler = parent_based_sampler(2.5)["typed_config"]["wrapped_sampler"]["typed_config"]
    assert sampler["sampling_percentage"] == {"numerator": 25_000, "denominator": "MILLION"}


def test_route_files_are_discovery_responses_renamed_into_place(tmp_path: Path) -> None:
    routes = tmp_path / "routes"
    version = write_route(routes, {"name": "outbound_model", "virtual_hosts": []})
    doc = yaml.safe_load((routes / "outbound_model.yaml").read_text())
    assert doc == {
        "version_info": version,
        "resources": [{"@type": ROUTE_TYPE, "name": "outbound_model", "virtual_hosts": []}],
    }
    assert write_route(routes, {"name": "outbound_model", "virtual_hosts": []}, version="7") == "7"
    assert [p.name for p in routes.iterdir()] == ["outbound_model.yaml"]
    assert not list((tmp_path / ".routes.staging").iterdir())
