"""What istio/ renders for overload and gray failures: the ingress's adaptive concurrency limit (shipped off) and its
refusal, the route timeout as DEADLINE_EXCEEDED, per-try timeouts that fit the gateway's model budget, and outlier
detection that counts timeouts (with Istio's translation of splitExternalLocalOriginErrors)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from services.mesh.durations import parse_duration
from services.mesh.errors import MeshConfigError
from services.mesh.loader import load_istio
from tests.unit.mesh.conftest import ISTIO, ROOT, dr
from tests.unit.mesh.test_envoyfilters import added, ingress_hcm, mapper_of
from tests.unit.mesh.test_render import cluster, routes_of

ADAPTIVE = "envoy.filters.http.adaptive_concurrency"


def gateway_in_flight_bound() -> int:
    (gateway,) = [d for d in load_istio([ISTIO]).destination_rules if d.spec.host == "gateway"]
    assert gateway.spec.traffic_policy is not None and gateway.spec.traffic_policy.connection_pool is not None
    http = gateway.spec.traffic_policy.connection_pool.http
    assert http is not None and http.http2_max_requests is not None
    return http.http2_max_requests


def test_the_ingress_bounds_its_calls_in_flight_by_a_gradient_controller() -> None:
    hcm = ingress_hcm([ISTIO])
    names = [f["name"] for f in hcm["http_filters"]]
    assert names[-2:] == [ADAPTIVE, "envoy.filters.http.router"]  # after auth and the rate limit: counts what passes
    config = hcm["http_filters"][-2]["typed_config"]["gradient_controller_config"]
    limits = config["concurrency_limit_params"]
    assert limits["max_concurrency_limit"] <= gateway_in_flight_bound()  # never above the static outer bound
    assert limits["min_concurrency_limit"] >= 1
    assert config["sample_aggregate_percentile"]["value"] == 50  # the median: a minority of slow calls does not count
    assert parse_duration(limits["concurrency_update_interval"]) <= 0.1  # follows the load within a tenth of a second


def test_an_adaptive_refusal_is_resource_exhausted_with_pushback() -> None:
    refusal = mapper_of(ingress_hcm([ISTIO]), "extension_filter", "reached_concurrency_limit")
    expression = refusal["filter"]["extension_filter"]["typed_config"]["expression"]
    assert expression == "response.code_details == 'reached_concurrency_limit'"  # the filter's own refusals only
    headers = added(refusal)
    assert headers["grpc-status"] == "8"  # RESOURCE_EXHAUSTED, not the UNAVAILABLE of the filter's 503
    assert f"retry after {headers['grpc-retry-pushback-ms']} ms" in refusal["body"]["inline_string"]


def timeout_mapper(hcm: dict[str, Any]) -> dict[str, Any]:
    """The mapper of the route's timeout: Envoy's upstream request timeout, or the stream's bound reached."""
    (found,) = [m for m in hcm["local_reply_config"]["mappers"] if "or_filter" in m["filter"]]
    either = found["filter"]["or_filter"]["filters"]
    assert either[0] == {"response_flag_filter": {"flags": ["UT"]}}
    assert either[1]["extension_filter"]["typed_config"]["expression"] == (
        "response.code_details == 'max_duration_timeout'"
    )
    return found


def test_the_route_timeout_is_deadline_exceeded() -> None:
    timeout = timeout_mapper(ingress_hcm([ISTIO]))
    assert added(timeout) == {"grpc-status": "4"}  # not the UNAVAILABLE of Envoy's 504
    assert "did not answer within the call's time" in timeout["body"]["inline_string"]
    short = ingress_hcm([ISTIO, ISTIO / "variants" / "ingress-timeouts-short.yaml"])
    assert added(timeout_mapper(short)) == {"grpc-status": "4"}  # the variant that replaces ingress-timeouts keeps it
    # a call without a deadline is bounded by the route's timeout too
    (ingress,) = routes_of([ISTIO], "ingress")
    bound = ingress["route"]["max_stream_duration"]
    assert bound["max_stream_duration"] == bound["grpc_timeout_header_max"] == ingress["route"]["timeout"] != "0s"


def model_budget_s() -> float:
    """The smallest model stage budget of the shipped pipelines (timeouts.model_ms, 500 ms when absent)."""
    budgets = []
    for path in sorted((ROOT / "pipelines").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        budgets.append(float((doc.get("timeouts") or {}).get("model_ms", 500.0)) / 1000)
    assert budgets
    return min(budgets)


def test_a_model_call_that_gets_no_answer_is_retried_elsewhere_within_the_model_budget() -> None:
    routes = routes_of([ISTIO])
    assert routes
    for route in routes:
        retry = route["route"]["retry_policy"]
        # Envoy retries a per-try timeout only under `reset` (or 5xx / gateway-error) when it does not hedge
        assert "reset" in retry["retry_on"].split(","), route["name"]
        assert parse_duration(retry["per_try_timeout"]) <= model_budget_s() / 2, route["name"]
        assert retry["num_retries"] >= 1 and retry["retry_host_predicate"], route["name"]  # on another replica
        assert "hedge_policy" not in route["route"]  # hedging did not pay (docs/mesh.md, "Gray failures")


def test_outlier_detection_counts_timeouts_with_the_gateway_errors() -> None:
    for name in ("outbound|grpc|v1|model", "outbound|grpc|v2|model"):
        od = cluster([ISTIO], name)["outlier_detection"]
        assert "split_external_local_origin_errors" not in od  # a per-try timeout counts as a 504 here
        assert od["consecutive_gateway_failure"] == 5 and od["enforcing_consecutive_gateway_failure"] == 100


def outlier(write_yaml: Any, detection: dict[str, Any]) -> dict[str, Any]:
    subsets = [{"name": v, "labels": {"version": v}} for v in ("v1", "v2")]
    spec = {"host": "model", "trafficPolicy": {"outlierDetection": detection}, "subsets": subsets}
    path = write_yaml("dr.yaml", dr(spec))
    od: dict[str, Any] = cluster([ISTIO, path], "outbound|grpc||model")["outlier_detection"]
    return od


def test_split_local_origin_errors_translate_as_istio_does(write_yaml: Any) -> None:
    od = outlier(write_yaml, {"splitExternalLocalOriginErrors": True, "consecutiveLocalOriginFailures": 3})
    assert od["split_external_local_origin_errors"] is True
    assert od["consecutive_local_origin_failure"] == 3 and od["enforcing_consecutive_local_origin_failure"] == 100
    assert od["enforcing_local_origin_success_rate"] == 0  # like success-rate ejection, off
    alone = outlier(write_yaml, {"splitExternalLocalOriginErrors": True})
    assert "consecutive_local_origin_failure" not in alone and alone["enforcing_local_origin_success_rate"] == 0
    counted = outlier(write_yaml, {"consecutiveLocalOriginFailures": 3})  # Istio: no effect without the split
    assert not {"split_external_local_origin_errors", "consecutive_local_origin_failure"} & set(counted)


def test_an_unknown_outlier_field_is_still_an_error(write_yaml: Any) -> None:
    with pytest.raises(MeshConfigError, match=r"outlierDetection\.consecutiveLocalOriginFailure:"):
        outlier(write_yaml, {"consecutiveLocalOriginFailure": 3})  # Envoy's spelling, not Istio's


def test_the_filter_ships_off_and_the_on_variant_is_the_same_filter_switched_on() -> None:
    """Off by default (closed-loop benchmarks and scale-to-zero cold starts read as overload), on where an operator
    asks: live through its runtime key, or with the variant."""

    def adaptive(paths: list[Any]) -> dict[str, Any]:
        (found,) = [f for f in ingress_hcm(paths)["http_filters"] if f["name"] == ADAPTIVE]
        config: dict[str, Any] = found["typed_config"]
        return config

    shipped = adaptive([ISTIO])
    on = adaptive([ISTIO, ISTIO / "variants" / "ingress-adaptive-on.yaml"])
    flag = {"runtime_key": "meshserve.ingress.adaptive_concurrency_enabled"}  # what `runtime_modify` turns on
    assert shipped.pop("enabled") == {**flag, "default_value": False}
    assert on.pop("enabled") == {**flag, "default_value": True}
    assert on == shipped
    # the refusal's mapping is there either way, so a filter turned on live answers RESOURCE_EXHAUSTED too
    variant = ingress_hcm([ISTIO, ISTIO / "variants" / "ingress-adaptive-on.yaml"])
    assert mapper_of(variant, "extension_filter", "reached_concurrency_limit") == mapper_of(
        ingress_hcm([ISTIO]), "extension_filter", "reached_concurrency_limit"
    )
