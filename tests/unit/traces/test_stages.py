"""The stage-name mapping: Envoy spans, gRPC server spans, prefixed and unprefixed span names."""

from __future__ import annotations

import pytest

from services.traces.records import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER
from services.traces.stages import envoy_where, is_envoy, service_key, stage_name


@pytest.mark.parametrize(
    ("service", "name", "kind", "expected"),
    [
        ("gateway", "features", KIND_INTERNAL, "gateway.features"),
        ("gateway", "model", KIND_INTERNAL, "gateway.model"),
        ("gateway", "cache.lookup", KIND_INTERNAL, "gateway.cache.lookup"),
        # The batched calls are stages of their own (see the module docstring), not folded into the member's stage.
        ("gateway", "features.batch", KIND_CLIENT, "gateway.features.batch"),
        ("gateway", "model.batch", KIND_CLIENT, "gateway.model.batch"),
        ("gateway", "cache.lookup.batch", KIND_CLIENT, "gateway.cache.lookup.batch"),
        ("gateway", "cache.store.batch", KIND_CLIENT, "gateway.cache.store.batch"),
        ("cache", "cache.lookup", KIND_INTERNAL, "cache.lookup"),
        ("feature", "feature.online_lookup", KIND_INTERNAL, "feature.online_lookup"),
        ("feature", "feature.static_lookup", KIND_INTERNAL, "feature.static_lookup"),
        ("model", "model.queue_wait", KIND_INTERNAL, "model.queue_wait"),
        ("model", "model.forward", KIND_INTERNAL, "model.forward"),
        ("model", "inference.GRPCInferenceService/ModelInfer", KIND_SERVER, "model.rpc"),
        ("gateway", "inference.GRPCInferenceService/ModelInfer", KIND_SERVER, "gateway.rpc"),
        ("feature", "meshserve.feature.FeatureService/Compute", KIND_SERVER, "feature.rpc"),
        ("gateway", "meshserve.cache.CacheService/Lookup", KIND_CLIENT, "gateway.call"),
        ("model-v2", "model.forward", KIND_INTERNAL, "model.forward"),
        ("meshserve-model-v1", "inference.GRPCInferenceService/ModelInfer", KIND_SERVER, "model.rpc"),
        ("model-2", "model.queue_wait", KIND_INTERNAL, "model.queue_wait"),
        ("", "work", KIND_INTERNAL, "unknown.work"),
        ("envoy-ingress", "127.0.0.1:8000", KIND_SERVER, "envoy.ingress"),
        ("meshserve-ingress", "ingress", KIND_SERVER, "envoy.ingress"),
        ("meshserve-ingress", "router gateway egress", KIND_CLIENT, "envoy.ingress.upstream"),
        ("model-sidecar", "model:8001", KIND_SERVER, "envoy.model"),
        ("model-sidecar", "router model egress", KIND_CLIENT, "envoy.model.upstream"),
        ("envoy", "egress", KIND_CLIENT, "envoy.upstream"),
        ("istio-proxy", "x", KIND_SERVER, "envoy"),
    ],
)
def test_stage_name(service: str, name: str, kind: int, expected: str) -> None:
    assert stage_name(service, name, kind) == expected


def test_envoy_by_component_tag() -> None:
    assert is_envoy("edge", {"component": "proxy"})
    assert stage_name("edge", "host", KIND_SERVER, {"component": "proxy"}) == "envoy.edge"
    assert not is_envoy("gateway", {"component": "grpc"})


def test_method_like_names_only_for_rpc_kinds() -> None:
    # An INTERNAL span that happens to look like a method is not an RPC.
    assert stage_name("gateway", "a.B/C", KIND_INTERNAL) == "gateway.a.B/C"
    assert stage_name("model", "/inference.GRPCInferenceService/ModelReady", KIND_SERVER) == "model.rpc"


def test_helpers() -> None:
    assert service_key(" Meshserve-Feature-v3 ") == "feature"
    assert envoy_where("gateway-sidecar") == "gateway"
    assert envoy_where("envoy") == ""
