"""EnvoyFilter patches on the ingress: the two shapes istio/ uses are applied, every other one is an error."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from services.mesh.bootstrap import render
from services.mesh.envoyfilters import HCM_TYPE, merge
from services.mesh.errors import MeshConfigError
from services.mesh.listeners import hcm_of
from services.mesh.loader import load_istio
from tests.unit.mesh.conftest import ISTIO, topology

HCM_NAME = "envoy.filters.network.http_connection_manager"


def ingress_hcm(paths: list[Path]) -> dict[str, Any]:
    rendered = render(load_istio(paths), topology(), Path("/tmp/routes"))
    return hcm_of(rendered.bootstrap["static_resources"]["listeners"][0])


def envoy_filter(patch: dict[str, Any], labels: dict[str, str] | None = None, name: str = "extra") -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "EnvoyFilter",
        "metadata": {"name": name},
        "spec": {"workloadSelector": {"labels": labels or {"istio": "ingressgateway"}}, "configPatches": [patch]},
    }


def merge_patch(config: dict[str, Any], context: str = "GATEWAY") -> dict[str, Any]:
    return {
        "applyTo": "NETWORK_FILTER",
        "match": {"context": context, "listener": {"filterChain": {"filter": {"name": HCM_NAME}}}},
        "patch": {"operation": "MERGE", "value": {"typed_config": {"@type": HCM_TYPE, **config}}},
    }


def insert_patch(before: str, value: dict[str, Any], operation: str = "INSERT_BEFORE") -> dict[str, Any]:
    return {
        "applyTo": "HTTP_FILTER",
        "match": {
            "context": "GATEWAY",
            "listener": {"filterChain": {"filter": {"name": HCM_NAME, "subFilter": {"name": before}}}},
        },
        "patch": {"operation": operation, "value": value},
    }


WRONG_TYPE = merge_patch({})
WRONG_TYPE["patch"]["value"]["typed_config"]["@type"] = "type.googleapis.com/x.Y"  # not the connection manager's
BUFFER = {
    "name": "envoy.filters.http.buffer",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
        "max_request_bytes": 1024,
    },
}


def test_istio_folder_patches_the_ingress_only() -> None:
    rendered = render(load_istio([ISTIO]), topology(), Path("/tmp/routes"))
    ingress, *sidecars = rendered.bootstrap["static_resources"]["listeners"]
    hcm = hcm_of(ingress)
    assert hcm["request_headers_timeout"] == "10s" and hcm["stream_idle_timeout"] == "30s"
    assert hcm["common_http_protocol_options"] == {"idle_timeout": "60s"}
    (early,) = hcm["early_header_mutation_extensions"]
    assert early["typed_config"]["mutations"] == [{"remove": "x-meshserve-subject"}]  # before jwt_authn writes it
    rate_limited = mapper_of(hcm, "status_code_filter")
    assert rate_limited["filter"]["status_code_filter"]["comparison"]["value"]["default_value"] == 429
    ratelimit = next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.local_ratelimit")
    config = ratelimit["typed_config"]
    assert config["rate_limited_as_resource_exhausted"] is True
    (descriptor,) = config["descriptors"]
    assert descriptor["entries"] == [{"key": "subject"}]  # no value: a bucket per subject
    bucket = descriptor["token_bucket"]
    assert bucket["tokens_per_fill"] / float(bucket["fill_interval"].rstrip("s")) >= 2000  # benchmarks fit in
    assert bucket["max_tokens"] > bucket["tokens_per_fill"]  # with a burst
    for sidecar in sidecars:
        assert "request_headers_timeout" not in hcm_of(sidecar)
        assert [f["name"] for f in hcm_of(sidecar)["http_filters"]] == [
            "envoy.filters.http.fault",
            "envoy.filters.http.router",
        ]


def test_variants_replace_the_envoy_filter_of_the_same_name() -> None:
    tiny = ingress_hcm([ISTIO, ISTIO / "variants" / "ingress-ratelimit-tiny.yaml"])
    ratelimit = next(f for f in tiny["http_filters"] if f["name"] == "envoy.filters.http.local_ratelimit")
    assert ratelimit["typed_config"]["descriptors"][0]["token_bucket"]["max_tokens"] == 3
    mappers = len(ingress_hcm([ISTIO])["local_reply_config"]["mappers"])
    assert len(tiny["local_reply_config"]["mappers"]) == mappers  # replaced, not added to
    short = ingress_hcm([ISTIO, ISTIO / "variants" / "ingress-timeouts-short.yaml"])
    assert short["stream_idle_timeout"] == "1s" and short["common_http_protocol_options"] == {"idle_timeout": "1s"}
    assert len(short["local_reply_config"]["mappers"]) == mappers
    assert "for 1 s" in mapper_of(short, "response_flag_filter", "SI")["body"]["inline_string"]


def mapper_of(hcm: dict[str, Any], kind: str, flag: str | None = None) -> dict[str, Any]:
    """The one local reply mapper whose filter is of `kind` (and names `flag`: among its response flags, or in its CEL
    expression)."""

    def names(f: dict[str, Any]) -> bool:
        return flag in (f["flags"] if "flags" in f else f["typed_config"]["expression"])

    found = [
        m
        for m in hcm["local_reply_config"]["mappers"]
        if kind in m["filter"] and (flag is None or names(m["filter"][kind]))
    ]
    assert len(found) == 1, hcm["local_reply_config"]
    return found[0]


def added(mapper: dict[str, Any]) -> dict[str, str]:
    return {h["header"]["key"]: h["header"]["value"] for h in mapper["headers_to_add"]}


def test_a_gateway_overflow_is_a_resource_exhausted_with_pushback() -> None:
    istio = load_istio([ISTIO])
    rendered = render(istio, topology(), Path("/tmp/routes"))
    overflow = mapper_of(hcm_of(rendered.bootstrap["static_resources"]["listeners"][0]), "response_flag_filter", "UO")
    headers = added(overflow)
    assert headers["grpc-status"] == "8"  # RESOURCE_EXHAUSTED, not the UNAVAILABLE of Envoy's 503
    message = overflow["body"]["inline_string"]
    assert f"retry after {headers['grpc-retry-pushback-ms']} ms" in message
    (gateway,) = [dr for dr in istio.destination_rules if dr.spec.host == "gateway"]
    assert gateway.spec.traffic_policy is not None and gateway.spec.traffic_policy.connection_pool is not None
    http = gateway.spec.traffic_policy.connection_pool.http
    assert http is not None
    assert f"has {http.http2_max_requests} requests in flight" in message  # the number the DestinationRule sets


def test_a_stream_idle_timeout_is_a_deadline_exceeded() -> None:
    hcm = ingress_hcm([ISTIO])
    idle = mapper_of(hcm, "response_flag_filter", "SI")
    assert added(idle) == {"grpc-status": "4"}  # not the UNKNOWN of Envoy's 408
    assert f"for {hcm['stream_idle_timeout'].rstrip('s')} s" in idle["body"]["inline_string"]


def test_a_token_for_another_audience_is_unauthenticated() -> None:
    audience = mapper_of(ingress_hcm([ISTIO]), "extension_filter", "jwt_authn")
    expression = audience["filter"]["extension_filter"]["typed_config"]["expression"]
    assert "403" in expression and "jwt_authn_access_denied" in expression  # jwt_authn's 403 only, never RBAC's
    assert audience["status_code"] == 401 and "body" not in audience  # jwt_authn's own message stays


def test_an_http_filter_is_inserted_before_the_named_one(write_yaml) -> None:
    path = write_yaml("ef.yaml", envoy_filter(insert_patch("envoy.filters.http.fault", BUFFER)))
    names = [f["name"] for f in ingress_hcm([ISTIO, path])["http_filters"]]
    assert names.index("envoy.filters.http.buffer") == names.index("envoy.filters.http.fault") - 1


def test_merge_appends_lists_merges_messages_replaces_scalars() -> None:
    target: dict[str, Any] = {"a": {"b": 1, "c": [1]}, "d": "x"}
    merge(target, {"a": {"c": [2], "e": 3}, "d": "y"}, "here")
    assert target == {"a": {"b": 1, "c": [1, 2], "e": 3}, "d": "y"}
    typed = {"t": {"@type": "type.googleapis.com/x", "f": 1}}
    with pytest.raises(MeshConfigError, match="merging into a typed"):
        merge(copy.deepcopy(typed), typed, "here")


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        (envoy_filter(insert_patch("envoy.filters.http.router", BUFFER, "INSERT_AFTER")), "HTTP_FILTER INSERT_AFTER"),
        (envoy_filter(insert_patch("envoy.filters.http.nope", BUFFER)), "no filter 'envoy.filters.http.nope'"),
        (envoy_filter(insert_patch("envoy.filters.http.router", {"name": "x"})), "needs exactly `name` and"),
        (envoy_filter(merge_patch({}, context="SIDECAR_INBOUND")), "match: the local mesh supports"),
        (envoy_filter(WRONG_TYPE), "needs exactly a typed_config of type"),
        (envoy_filter(merge_patch({}), labels={"app": "model"}), "only EnvoyFilters of the ingress gateway"),
        (
            envoy_filter(
                {
                    "applyTo": "CLUSTER",
                    "match": {"context": "GATEWAY", "listener": {"filterChain": {"filter": {"name": HCM_NAME}}}},
                    "patch": {"operation": "MERGE", "value": {}},
                }
            ),
            "CLUSTER MERGE: the local mesh supports",
        ),
    ],
)
def test_any_other_patch_is_an_error(write_yaml, doc: dict[str, Any], fragment: str) -> None:
    with pytest.raises(MeshConfigError, match=fragment):
        ingress_hcm([ISTIO, write_yaml("ef.yaml", doc)])
