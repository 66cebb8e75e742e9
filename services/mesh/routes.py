"""VirtualServices to Envoy route configurations: matches, weights, retries, timeouts, fault injection."""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

import grpc

from services.common.validation import field_path
from services.mesh.durations import envoy_duration, parse_duration
from services.mesh.errors import MeshConfigError
from services.mesh.hosts import cluster_name, service_of
from services.mesh.istio import (
    HTTPFaultInjection,
    HTTPMatchRequest,
    HTTPRetry,
    HTTPRoute,
    StringMatch,
    VirtualService,
)
from services.mesh.loader import IstioConfig

FAULT_FILTER = "envoy.filters.http.fault"
GRPC_CODES = {code.name: code.value[0] for code in grpc.StatusCode}
HTTP_STATUS_CODES = {status.value for status in HTTPStatus}

Weights = Mapping[str, Mapping[str, int]]
"""Run-time weight overrides: service -> subset -> weight (applied to every split route of that service)."""


def string_match(m: StringMatch) -> dict[str, Any]:
    if m.exact is not None:
        return {"exact": m.exact}
    if m.prefix is not None:
        return {"prefix": m.prefix}
    return {"safe_regex": {"regex": m.regex}}


def route_matches(route: HTTPRoute) -> list[dict[str, Any]]:
    """One Envoy match per Istio match (Istio ORs them); none matches everything."""
    out: list[dict[str, Any]] = []
    matches: list[HTTPMatchRequest | None] = list(route.match) or [None]
    for m in matches:
        match: dict[str, Any] = {"prefix": "/"}
        if m is not None and m.uri is not None:
            u = m.uri
            match = (
                {"path": u.exact}
                if u.exact
                else {"prefix": u.prefix}
                if u.prefix
                else {"safe_regex": {"regex": u.regex}}
            )
        if m is not None and m.headers:
            match["headers"] = [{"name": k, "string_match": string_match(v)} for k, v in m.headers.items()]
        out.append(match)
    return out


# Istio's DefaultPolicy (pilot/pkg/networking/core/route/retry/retry.go): what a route without `retries` gets.
DEFAULT_RETRY_ATTEMPTS = 2
DEFAULT_RETRY_ON = "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
DEFAULT_RETRIABLE_STATUS_CODES = [503]
HOST_SELECTION_RETRY_MAX_ATTEMPTS = 5
PREVIOUS_HOSTS = {
    "name": "envoy.retry_host_predicates.previous_hosts",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
    },
}


def default_retry_policy() -> dict[str, Any]:
    """Istio's default: 2 retries on connection failures, UNAVAILABLE, CANCELLED and HTTP 503, each on another host."""
    return {
        "retry_on": DEFAULT_RETRY_ON,
        "num_retries": DEFAULT_RETRY_ATTEMPTS,
        "retry_host_predicate": [PREVIOUS_HOSTS],
        "host_selection_retry_max_attempts": HOST_SELECTION_RETRY_MAX_ATTEMPTS,
        "retriable_status_codes": list(DEFAULT_RETRIABLE_STATUS_CODES),
    }


def parse_retry_on(retry_on: str) -> tuple[str, list[int]]:
    """Istio's split of `retryOn`: Envoy conditions, and the HTTP status codes among them."""
    named: list[str] = []
    codes: list[int] = []
    for part in (p.strip() for p in retry_on.split(",")):
        if part.isdigit() and int(part) in HTTP_STATUS_CODES:
            codes.append(int(part))
        elif part:
            named.append(part)
    return ",".join(named), codes


def retry_policy(retries: HTTPRetry | None) -> dict[str, Any] | None:
    """Istio's ConvertPolicy: no `retries` gets the default policy, `attempts: 0` none, anything else the default
    with the given fields replaced (status codes in `retryOn` become retriable_status_codes)."""
    policy = default_retry_policy()
    if retries is None:
        return policy
    if retries.attempts <= 0:
        return None
    policy["num_retries"] = retries.attempts
    if retries.retry_on:
        retry_on, codes = parse_retry_on(retries.retry_on)
        if codes and "retriable-status-codes" not in retry_on:
            retry_on += ",retriable-status-codes"
        policy["retry_on"] = retry_on
        policy["retriable_status_codes"] = codes
    if not policy["retriable_status_codes"]:
        del policy["retriable_status_codes"]
    if retries.per_try_timeout is not None:
        policy["per_try_timeout"] = envoy_duration(parse_duration(retries.per_try_timeout))
    return policy


def percentage(value: float | None) -> dict[str, Any]:
    return {"numerator": round((100.0 if value is None else value) * 10_000), "denominator": "MILLION"}


def fault_config(fault: HTTPFaultInjection, where: str) -> dict[str, Any]:
    out: dict[str, Any] = {"@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault"}
    if fault.delay is not None:
        out["delay"] = {
            "fixed_delay": envoy_duration(parse_duration(fault.delay.fixed_delay)),
            "percentage": percentage(fault.delay.percentage.value if fault.delay.percentage else None),
        }
    if fault.abort is not None:
        abort: dict[str, Any] = {
            "percentage": percentage(fault.abort.percentage.value if fault.abort.percentage else None)
        }
        if fault.abort.grpc_status is not None:
            code = GRPC_CODES.get(fault.abort.grpc_status.upper())
            if code is None:
                raise MeshConfigError(
                    f"{where}.fault.abort.grpcStatus: unknown gRPC status {fault.abort.grpc_status!r}"
                )
            abort["grpc_status"] = code
        else:
            abort["http_status"] = fault.abort.http_status
        out["abort"] = abort
    return out


def route_action(vs: VirtualService, route: HTTPRoute, where: str, known: set[str], weights: Weights) -> dict[str, Any]:
    targets: list[tuple[str, str | None, int | None]] = []
    for j, rd in enumerate(route.route):
        service = service_of(rd.destination.host)
        name = cluster_name(service, rd.destination.subset)
        if name not in known:
            what = f"subset '{rd.destination.subset}' of " if rd.destination.subset else ""
            raise MeshConfigError(
                f"{vs.source}: VirtualService '{vs.metadata.name}': {where}.route.{j}.destination: {what}host "
                f"'{rd.destination.host}' is not defined (not in the topology, or no such subset)"
            )
        targets.append((service, rd.destination.subset, rd.weight))
    action: dict[str, Any] = {}
    if len(targets) == 1:
        action["cluster"] = cluster_name(targets[0][0], targets[0][1])
    else:
        override = weights.get(targets[0][0]) if len({t[0] for t in targets}) == 1 else None
        clusters: list[dict[str, Any]] = []
        for service, subset, weight in targets:
            w = override.get(subset or "", 0) if override is not None else weight
            clusters.append({"name": cluster_name(service, subset), "weight": 0 if w is None else w})
        if sum(int(c["weight"]) for c in clusters) <= 0:
            raise MeshConfigError(f"{vs.source}: VirtualService '{vs.metadata.name}': {where}.route: weights sum to 0")
        action["weighted_clusters"] = {"clusters": clusters}
    timeout = envoy_duration(parse_duration(route.timeout)) if route.timeout else "0s"
    action["timeout"] = timeout  # Istio: no timeout unless set; a gRPC deadline (grpc-timeout) still applies
    # With max_stream_duration Envoy ignores `timeout` and bounds the stream instead: by the call's grpc-timeout
    # capped at the route's timeout, and by the route's timeout alone for a call without a deadline (as Istio's
    # max_grpc_timeout does); past it the call ends DEADLINE_EXCEEDED (response flag DT).
    action["max_stream_duration"] = {"grpc_timeout_header_max": timeout}
    if route.timeout:
        action["max_stream_duration"]["max_stream_duration"] = timeout
    retry = retry_policy(route.retries)
    if retry is not None:
        action["retry_policy"] = retry
    return action


def envoy_routes(vs: VirtualService, known: set[str], weights: Weights) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, route in enumerate(vs.spec.http):
        where = field_path(("spec", "http", i))
        action = route_action(vs, route, where, known, weights)
        match_names = [m.name for m in route.match] or [None]
        for k, match in enumerate(route_matches(route)):
            entry: dict[str, Any] = {
                "name": f"{vs.metadata.name}.{route.name or i}.{match_names[k] or k}",  # Envoy route name in stats/logs
                "match": match,
                "route": action,
            }
            if route.headers is not None and route.headers.request is not None and route.headers.request.remove:
                # Istio's headers.request.remove: removed by the router as it forwards, after every HTTP filter ran
                entry["request_headers_to_remove"] = list(route.headers.request.remove)
            if route.fault is not None:
                entry["typed_per_filter_config"] = {
                    FAULT_FILTER: fault_config(
                        route.fault, f"{vs.source}: VirtualService '{vs.metadata.name}': {where}"
                    )
                }
            out.append(entry)
    return out


def mesh_virtual_services(istio: IstioConfig, service: str) -> list[VirtualService]:
    """VirtualServices that apply to calls to `service` inside the mesh (no gateways, or `mesh` among them)."""
    return [
        vs
        for vs in istio.virtual_services
        if any(service_of(h) == service for h in vs.spec.hosts) and (not vs.spec.gateways or "mesh" in vs.spec.gateways)
    ]


def gateway_virtual_services(istio: IstioConfig) -> list[VirtualService]:
    """VirtualServices bound to one of the Gateways (the ingress listener's routes)."""
    names = {gw.metadata.name for gw in istio.gateways}
    return [vs for vs in istio.virtual_services if any(g.rpartition("/")[2] in names for g in vs.spec.gateways)]


def route_configuration(
    name: str, vss: list[VirtualService], known: set[str], weights: Weights, default: str | None
) -> dict[str, Any]:
    """An Envoy RouteConfiguration; without a VirtualService all calls go to `default` (Istio's default route)."""
    routes: list[dict[str, Any]] = []
    for vs in vss:
        routes.extend(envoy_routes(vs, known, weights))
    if not routes and default is not None:
        # Istio's default outbound route: no timeout (a gRPC deadline still applies) and the default retry policy.
        action = {
            "cluster": default,
            "timeout": "0s",
            "max_stream_duration": {"grpc_timeout_header_max": "0s"},
            "retry_policy": default_retry_policy(),
        }
        routes.append({"name": "default", "match": {"prefix": "/"}, "route": action})
    return {"name": name, "virtual_hosts": [{"name": name, "domains": ["*"], "routes": routes}]}


def split_subsets(istio: IstioConfig, service: str) -> list[str]:
    """Subsets that a weighted (split) route of `service` sends to, in order; empty if nothing splits."""
    out: list[str] = []
    for vs in mesh_virtual_services(istio, service):
        for route in vs.spec.http:
            if len(route.route) > 1 and all(service_of(d.destination.host) == service for d in route.route):
                out.extend(d.destination.subset or "" for d in route.route if (d.destination.subset or "") not in out)
    return out


def declared_weights(istio: IstioConfig, service: str) -> dict[str, int]:
    """The weights `istio/` gives the first split route of `service` (what rollback-to-file would restore)."""
    for vs in mesh_virtual_services(istio, service):
        for route in vs.spec.http:
            if len(route.route) > 1 and all(service_of(d.destination.host) == service for d in route.route):
                return {(d.destination.subset or ""): d.weight or 0 for d in route.route}
    return {}
