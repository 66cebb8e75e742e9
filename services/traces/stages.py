"""The stage name of a span, `<service>.<what>`, so that breakdowns read like `feature.online_lookup`.

Rules, in order (the service is the resource's service.name):

1. Envoy spans (service name containing `envoy`, ending in `-ingress`, `-egress` or `-sidecar`, or `istio-proxy`;
   or a span with attribute `component=proxy`) become `envoy.<where>`, and `envoy.<where>.upstream` for CLIENT spans
   (Envoy's upstream span), where `<where>` is the service name without `envoy`, `meshserve`, `istio-proxy`,
   `sidecar` parts: `meshserve-ingress` / `envoy-ingress` -> `envoy.ingress`, `model-sidecar` -> `envoy.model`,
   plain `envoy` -> `envoy` (`envoy.upstream`).
2. Other services are normalised first: lowercased, a `meshserve-` prefix and a `-v<N>` / `-<N>` suffix
   (version or replica) dropped, so `meshserve-model-v2` counts as `model`; no service name gives `unknown`.
3. A SERVER span named like a gRPC method, `<pkg.Service>/<Method>`, becomes `<service>.rpc` (a CLIENT one
   `<service>.call`): `inference.GRPCInferenceService/ModelInfer` of `model` -> `model.rpc`.
4. A span whose name already starts with `<service>.` keeps its name: `feature.online_lookup`, `model.forward`.
5. Anything else is prefixed: the gateway's `features` -> `gateway.features`, its `cache.lookup` ->
   `gateway.cache.lookup` (the cache call as the gateway sees it; the cache service's own is `cache.lookup`).

The gateway's batched calls (`features.batch`, `model.batch`, `cache.lookup.batch`, `cache.store.batch`, CLIENT
spans under the first member's stage span) are stages of their own by rule 5, `gateway.features.batch` and so on,
deliberately not folded into `gateway.features`: a member's `gateway.features` is then the time micro-batching adds
to its hop (waiting for a batch to form behind the one in flight, taking its rows out of the answer), which a lone
request should not pay, and `gateway.features.batch` is the gateway's side of the shared call (building the batched
request, the gRPC client, outside Envoy's span), which every member is attributed (`services.traces.analysis`).
Likewise the gateway's `park` span (a request waiting for a model with no serving replica, a child of its `model`
span) is the stage `gateway.park`, so time spent waiting for a cold start is never read as the model's.

Across tiers (several stores read as one, each span carrying the tier it was collected in, `records.TIER`): a span
of a tier other than the home one (the tier the requests enter, the first store read) has its stage prefixed with
the tier, `cloud:gateway.model`; the edge gateway's call to the cloud is `gateway.cloud` (its batched call
`gateway.cloud.batch`), and the hop between the tiers is the stage `wan` (`services.traces.analysis`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from services.traces.records import KIND_CLIENT, KIND_SERVER

GRPC_METHOD = re.compile(r"^/?[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+/[A-Za-z_]\w*$")
SUFFIX = re.compile(r"-(v?\d+)$")
ENVOY_WORDS = {"envoy", "meshserve", "istio", "proxy", "sidecar"}
WAN = "wan"  # the hop from one tier to another (`services.traces.analysis`)
CLOUD_CALL = "gateway.cloud"  # the edge gateway's call to the cloud tier, whole when the cloud's spans are missing


def is_envoy(service: str, attributes: Mapping[str, Any] | None = None) -> bool:
    """Whether the span comes from an Envoy proxy (by its service name, or Envoy's `component=proxy` tag)."""
    s = service.lower()
    if "envoy" in s or s.endswith(("-ingress", "-egress", "-sidecar")) or s == "istio-proxy":
        return True
    return attributes is not None and attributes.get("component") == "proxy"


def envoy_where(service: str) -> str:
    """Where an Envoy sits, from its service name: `meshserve-ingress` -> `ingress`, `model-sidecar` -> `model`."""
    words = [w for w in re.split(r"[-_.\s]+", service.lower()) if w and w not in ENVOY_WORDS]
    return "-".join(words)


def service_key(service: str) -> str:
    """A service name as stages use it: lowercased, no `meshserve-` prefix, no `-v2` / `-1` suffix."""
    s = service.strip().lower()
    s = s.removeprefix("meshserve-")
    s = SUFFIX.sub("", s)
    return s or "unknown"


def stage_name(service: str, name: str, kind: int, attributes: Mapping[str, Any] | None = None) -> str:
    """The stage a span belongs to (see the module docstring for the rules)."""
    if is_envoy(service, attributes):
        where = envoy_where(service)
        base = f"envoy.{where}" if where else "envoy"
        return f"{base}.upstream" if kind == KIND_CLIENT else base
    svc = service_key(service)
    if GRPC_METHOD.match(name) and kind in (KIND_SERVER, KIND_CLIENT):
        return f"{svc}.rpc" if kind == KIND_SERVER else f"{svc}.call"
    if name.startswith(f"{svc}."):
        return name
    return f"{svc}.{name}"


def tiered(stage: str, tier: str | None, home: str | None) -> str:
    """The stage of a span of `tier` read with `home` as the home tier: prefixed `<tier>:` unless it is home."""
    return f"{tier}:{stage}" if tier and home and tier != home else stage


def is_remote(stage: str) -> bool:
    """Whether the stage is the WAN hop or a stage of another tier than the home one."""
    return stage == WAN or ":" in stage
