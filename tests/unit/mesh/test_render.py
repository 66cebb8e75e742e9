"""Each translated Istio field as it appears in the rendered Envoy configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.mesh.bootstrap import render
from services.mesh.errors import MeshConfigError
from services.mesh.loader import load_istio
from services.mesh.topology import HealthCheck
from tests.unit.mesh.conftest import ISTIO, dr, topology, vs

PREVIOUS_HOSTS = "envoy.retry_host_predicates.previous_hosts"


def rendered(paths: list[Path], **topo: Any):
    return render(load_istio(paths), topology(**topo), Path("/tmp/routes"))


def routes_of(paths: list[Path], name: str = "outbound_model", **kw: Any) -> list[dict]:
    return rendered(paths, **kw).routes[name]["virtual_hosts"][0]["routes"]


def cluster(paths: list[Path], name: str, **topo: Any) -> dict:
    clusters = rendered(paths, **topo).bootstrap["static_resources"]["clusters"]
    return next(c for c in clusters if c["name"] == name)


def test_header_match_then_weighted_split() -> None:
    version1, version2, header, split = routes_of([ISTIO])
    assert version1["match"]["headers"] == [{"name": "x-model-version", "string_match": {"exact": "1"}}]
    assert version1["route"]["cluster"] == "outbound|grpc|v1|model"
    assert version2["route"]["cluster"] == "outbound|grpc|v2|model"
    assert header["match"] == {"prefix": "/", "headers": [{"name": "x-canary", "string_match": {"exact": "true"}}]}
    assert header["route"]["cluster"] == "outbound|grpc|v2|model"
    assert split["match"] == {"prefix": "/"}
    assert split["route"]["weighted_clusters"] == {
        "clusters": [{"name": "outbound|grpc|v1|model", "weight": 90}, {"name": "outbound|grpc|v2|model", "weight": 10}]
    }


def test_retries_timeouts_and_previous_hosts() -> None:
    route = routes_of([ISTIO])[-1]["route"]
    assert route["timeout"] == "5s"
    # the call's deadline capped at 5 s, and 5 s for a call without one
    assert route["max_stream_duration"] == {"grpc_timeout_header_max": "5s", "max_stream_duration": "5s"}
    retry = route["retry_policy"]
    assert retry["retry_on"] == "unavailable,resource-exhausted,cancelled,connect-failure,reset"
    assert retry["num_retries"] == 3
    assert retry["per_try_timeout"] == "0.25s"
    assert retry["retry_host_predicate"][0]["name"] == PREVIOUS_HOSTS
    assert retry["host_selection_retry_max_attempts"] >= 5


def test_numeric_retry_on_becomes_retriable_status_codes(write_yaml) -> None:
    path = write_yaml(
        "vs.yaml",
        vs([{"route": [{"destination": {"host": "model"}}], "retries": {"attempts": 1, "retryOn": "503,unavailable"}}]),
    )
    retry = routes_of([path])[0]["route"]["retry_policy"]
    assert retry["retry_on"] == "unavailable,retriable-status-codes"
    assert retry["retriable_status_codes"] == [503]


# Istio's DefaultPolicy, as pilot/pkg/networking/core/route/retry/retry.go builds it for a route without `retries`.
ISTIO_DEFAULT_RETRY_POLICY = {
    "retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
    "num_retries": 2,
    "retry_host_predicate": [
        {
            "name": PREVIOUS_HOSTS,
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
            },
        }
    ],
    "host_selection_retry_max_attempts": 5,
    "retriable_status_codes": [503],
}


def test_no_retries_means_istios_default_policy_and_no_timeout(write_yaml) -> None:
    path = write_yaml("vs.yaml", vs([{"route": [{"destination": {"host": "model"}}]}]))
    route = routes_of([path])[0]["route"]
    assert route["timeout"] == "0s"
    assert route["retry_policy"] == ISTIO_DEFAULT_RETRY_POLICY
    assert route["cluster"] == "outbound|grpc||model"


def test_zero_attempts_means_no_retries(write_yaml) -> None:
    path = write_yaml("vs.yaml", vs([{"route": [{"destination": {"host": "model"}}], "retries": {"attempts": 0}}]))
    assert "retry_policy" not in routes_of([path])[0]["route"]


def test_given_retry_fields_replace_the_defaults_one_by_one(write_yaml) -> None:
    """Istio's ConvertPolicy: attempts, retryOn and perTryTimeout replace their default; the rest stays."""
    only_attempts = {"attempts": 4}
    path = write_yaml("vs.yaml", vs([{"route": [{"destination": {"host": "model"}}], "retries": only_attempts}]))
    retry = routes_of([path])[0]["route"]["retry_policy"]
    assert retry == {**ISTIO_DEFAULT_RETRY_POLICY, "num_retries": 4}
    named = {"attempts": 1, "retryOn": "unavailable, reset", "perTryTimeout": "250ms"}
    path = write_yaml("vs.yaml", vs([{"route": [{"destination": {"host": "model"}}], "retries": named}]))
    retry = routes_of([path])[0]["route"]["retry_policy"]
    expected = {
        **ISTIO_DEFAULT_RETRY_POLICY,
        "num_retries": 1,
        "retry_on": "unavailable,reset",
        "per_try_timeout": "0.25s",
    }
    del expected["retriable_status_codes"]  # retryOn named no status code
    assert retry == expected
    explicit = {"attempts": 2, "retryOn": "retriable-status-codes,502,999"}  # 999: not an HTTP status, kept as named
    path = write_yaml("vs.yaml", vs([{"route": [{"destination": {"host": "model"}}], "retries": explicit}]))
    retry = routes_of([path])[0]["route"]["retry_policy"]
    assert retry["retry_on"] == "retriable-status-codes,999" and retry["retriable_status_codes"] == [502]


def test_routes_of_the_real_istio_folder_without_retries_get_the_default(write_yaml) -> None:
    cache_watch = routes_of([ISTIO], "outbound_cache")[0]
    assert cache_watch["name"] == "cache.cache-watch.0"
    assert "retry_policy" not in cache_watch["route"]  # `attempts: 0`: the gateway reopens its Watch stream itself
    cache = routes_of([ISTIO], "outbound_cache")[1]
    assert cache["route"]["retry_policy"]["num_retries"] != 0  # the cache's own route keeps its retries
    fault = routes_of([ISTIO, ISTIO / "variants" / "model-fault.yaml"])[0]
    assert fault["route"]["retry_policy"] == ISTIO_DEFAULT_RETRY_POLICY  # aborts are local replies: never retried
    default = routes_of([ISTIO], "outbound_gateway")[0]  # no VirtualService: Istio's default outbound route
    assert default["route"] == {
        "cluster": "outbound|grpc||gateway",
        "timeout": "0s",
        "max_stream_duration": {"grpc_timeout_header_max": "0s"},
        "retry_policy": ISTIO_DEFAULT_RETRY_POLICY,
    }


def test_fault_injection_per_route() -> None:
    route = routes_of([ISTIO, ISTIO / "variants" / "model-fault.yaml"])[0]
    fault = route["typed_per_filter_config"]["envoy.filters.http.fault"]
    assert fault["abort"] == {"percentage": {"numerator": 100_000, "denominator": "MILLION"}, "grpc_status": 14}
    assert fault["delay"] == {"fixed_delay": "0.05s", "percentage": {"numerator": 200_000, "denominator": "MILLION"}}
    filters = rendered([ISTIO]).bootstrap["static_resources"]["listeners"][1]["filter_chains"][0]["filters"][0]
    names = [f["name"] for f in filters["typed_config"]["http_filters"]]
    assert names == ["envoy.filters.http.fault", "envoy.filters.http.router"]  # fault before the router


def test_uri_and_regex_matches(write_yaml) -> None:
    http = [
        {
            "match": [
                {"name": "tenant", "uri": {"prefix": "/inference."}, "headers": {"x-tenant": {"regex": "a.*"}}},
                {"uri": {"exact": "/x"}},
            ],
            "route": [{"destination": {"host": "model"}}],
        }
    ]
    first, second = routes_of([write_yaml("vs.yaml", vs(http))])
    assert first["match"] == {
        "prefix": "/inference.",
        "headers": [{"name": "x-tenant", "string_match": {"safe_regex": {"regex": "a.*"}}}],
    }
    assert second["match"] == {"path": "/x"}
    assert (first["name"], second["name"]) == ("model.0.tenant", "model.0.1")  # HTTPRoute / match names


def test_unknown_subset_is_an_error(write_yaml) -> None:
    path = write_yaml("vs.yaml", vs([{"route": [{"destination": {"host": "model", "subset": "v3"}}]}]))
    with pytest.raises(
        MeshConfigError, match=r"vs\.yaml: VirtualService 'model': spec\.http\.0\.route\.0\.destination"
    ):
        routes_of([path])


def test_weight_overrides_apply_to_split_routes_only() -> None:
    r = render(load_istio([ISTIO]), topology(), Path("/tmp/r"), {"model": {"v1": 25, "v2": 75}})
    *_, header, split = r.routes["outbound_model"]["virtual_hosts"][0]["routes"]
    assert [c["weight"] for c in split["route"]["weighted_clusters"]["clusters"]] == [25, 75]
    assert header["route"]["cluster"] == "outbound|grpc|v2|model"


def test_ingress_routes_follow_the_gateway_bound_virtual_service() -> None:
    routes = rendered([ISTIO]).routes["ingress"]["virtual_hosts"][0]["routes"]
    assert routes[0]["route"]["cluster"] == "outbound|grpc||gateway"
    assert rendered([ISTIO]).routes["outbound_gateway"]["virtual_hosts"][0]["routes"][0]["name"] == "default"


def test_the_ingress_passes_a_shed_on_while_internal_hops_retry_it() -> None:
    (ingress,) = routes_of([ISTIO], "ingress")
    conditions = ingress["route"]["retry_policy"]["retry_on"].split(",")
    assert "resource-exhausted" not in conditions  # the gateway's pushback goes to the client
    assert {"unavailable", "cancelled", "connect-failure"} <= set(conditions)  # a killed or draining replica
    for service in ("model", "feature"):
        for route in routes_of([ISTIO], f"outbound_{service}"):
            assert "resource-exhausted" in route["route"]["retry_policy"]["retry_on"].split(","), route["name"]


def test_the_gateway_service_bounds_its_requests_in_flight() -> None:
    for name in ("outbound|grpc||gateway", "outbound|grpc|v1|gateway"):
        (thresholds,) = cluster([ISTIO], name)["circuit_breakers"]["thresholds"]
        assert thresholds["max_requests"] == 64, name  # Envoy's overflow beyond it: RESOURCE_EXHAUSTED, see below
        assert thresholds["max_pending_requests"] == 64, name


def test_subset_clusters_load_balancer_pool_and_outlier_detection() -> None:
    v1 = cluster([ISTIO], "outbound|grpc|v1|model")
    v2 = cluster([ISTIO], "outbound|grpc|v2|model")
    assert len(v1["load_assignment"]["endpoints"][0]["lb_endpoints"]) == 2
    assert len(v2["load_assignment"]["endpoints"][0]["lb_endpoints"]) == 1
    assert v1["lb_policy"] == "LEAST_REQUEST"
    assert v1["connect_timeout"] == "1s"
    assert v1["circuit_breakers"]["thresholds"][0] == {
        "max_connections": 100,
        "max_pending_requests": 1024,
        "max_requests": 1024,
        "max_retries": 64,
    }
    assert v1["outlier_detection"] == {
        "enforcing_success_rate": 0,
        "consecutive_gateway_failure": 5,
        "enforcing_consecutive_gateway_failure": 100,
        "consecutive_5xx": 5,
        "enforcing_consecutive_5xx": 100,
        "interval": "5s",
        "base_ejection_time": "30s",
        "max_ejection_percent": 50,
    }
    assert v1["common_lb_config"] == {"healthy_panic_threshold": {"value": 0}}
    options = v1["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert options["explicit_http_config"] == {"http2_protocol_options": {}}


def test_subset_traffic_policy_and_other_fields(write_yaml) -> None:
    spec = {
        "host": "model.meshserve.svc.cluster.local",
        "trafficPolicy": {
            "loadBalancer": {"simple": "ROUND_ROBIN"},
            "connectionPool": {"http": {"maxRequestsPerConnection": 10, "idleTimeout": "30s"}},
            "outlierDetection": {"consecutiveGatewayErrors": 3, "minHealthPercent": 20},
        },
        "subsets": [
            {"name": "v2", "labels": {"version": "v2"}, "trafficPolicy": {"loadBalancer": {"simple": "RANDOM"}}}
        ],
    }
    path = write_yaml("dr.yaml", dr(spec))
    top = cluster([path], "outbound|grpc||model")
    assert top["lb_policy"] == "ROUND_ROBIN"
    opts = top["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert opts["common_http_protocol_options"] == {"max_requests_per_connection": 10, "idle_timeout": "30s"}
    assert top["outlier_detection"]["enforcing_consecutive_5xx"] == 0
    assert top["common_lb_config"] == {"healthy_panic_threshold": {"value": 20}}
    sub = cluster([path], "outbound|grpc|v2|model")
    assert sub["lb_policy"] == "RANDOM"
    assert sub["outlier_detection"]["consecutive_gateway_failure"] == 3  # inherited from the top level


def test_active_grpc_health_checks_from_the_topology() -> None:
    hc = HealthCheck(interval="0.5s", timeout="0.2s", unhealthy_threshold=3, no_traffic_interval="1s")
    checks = cluster([ISTIO], "outbound|grpc|v1|model", health_check=hc)["health_checks"]
    assert checks == [
        {
            "timeout": "0.2s",
            "interval": "0.5s",
            "no_traffic_interval": "1s",
            "unhealthy_threshold": 3,
            "healthy_threshold": 1,
            "grpc_health_check": {"service_name": ""},
        }
    ]
    assert "health_checks" not in cluster([ISTIO], "outbound|grpc|v1|model", health_check=None)


def test_listeners_addresses_rds_and_admin() -> None:
    boot = rendered([ISTIO]).bootstrap
    listeners = {item["name"]: item for item in boot["static_resources"]["listeners"]}
    assert set(listeners) == {"ingress", "gateway", "model", "feature", "cache"}
    assert listeners["ingress"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 8080}
    assert listeners["model"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 18001}
    hcm = listeners["model"]["filter_chains"][0]["filters"][0]["typed_config"]
    source = hcm["rds"]["config_source"]["path_config_source"]
    assert source == {"path": "/tmp/routes/outbound_model.yaml", "watched_directory": {"path": "/tmp/routes"}}
    assert boot["admin"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 9901}
    assert boot["node"]["id"]
    assert "tracing" not in hcm  # no collector in the topology


def test_tracing_with_a_collector() -> None:
    boot = rendered([ISTIO], otlp="127.0.0.1:4317").bootstrap
    hcm = boot["static_resources"]["listeners"][1]["filter_chains"][0]["filters"][0]["typed_config"]
    provider = hcm["tracing"]["provider"]
    assert provider["name"] == "envoy.tracers.opentelemetry"
    config = provider["typed_config"]
    assert config["grpc_service"]["envoy_grpc"]["cluster_name"] == "opentelemetry_collector"
    ratio = config["sampler"]["typed_config"]["wrapped_sampler"]["typed_config"]["sampling_percentage"]
    assert ratio == {"numerator": 10_000, "denominator": "MILLION"}  # randomSamplingPercentage: 1
    otlp = next(c for c in boot["static_resources"]["clusters"] if c["name"] == "opentelemetry_collector")
    assert "http2_protocol_options" in str(otlp["typed_extension_protocol_options"])


def test_envoys_tracer_flushes_on_a_timer_only_when_it_traces_and_runtime_keys_are_settable_live() -> None:
    """An admin layer, last, in every bootstrap: without one Envoy answers /runtime_modify 503 and the ingress's
    adaptive concurrency limit, shipped off, could not be turned on live."""
    traced = rendered([ISTIO], otlp="127.0.0.1:4317").bootstrap
    layer, admin = traced["layered_runtime"]["layers"]
    assert layer["static_layer"] == {
        "tracing.opentelemetry.flush_interval_ms": 500,
        "tracing.opentelemetry.min_flush_spans": 10_000,
    }
    assert admin == {"name": "admin", "admin_layer": {}}  # last: what /runtime_modify sets overrides the tracer's
    untraced = rendered([ISTIO]).bootstrap["layered_runtime"]["layers"]
    assert untraced == [admin]  # no collector, no tracer; the admin layer still there
