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
    (mapper,) = hcm["local_reply_config"]["mappers"]
    assert mapper["filter"]["status_code_filter"]["comparison"]["value"]["default_value"] == 429
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
    assert len(tiny["local_reply_config"]["mappers"]) == 1  # replaced, not added to
    short = ingress_hcm([ISTIO, ISTIO / "variants" / "ingress-timeouts-short.yaml"])
    assert short["stream_idle_timeout"] == "1s" and short["common_http_protocol_options"] == {"idle_timeout": "1s"}


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
