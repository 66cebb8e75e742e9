"""Pydantic models of the subset of Istio v1 resources the local mesh understands; any other field is an error."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from services.mesh.durations import Duration


class IstioModel(BaseModel):
    """Istio's camelCase field names; unknown fields are rejected, so nothing is silently dropped."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)


class Metadata(IstioModel):
    name: str
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


# -- VirtualService ----------------------------------------------------------------------------------------


class StringMatch(IstioModel):
    """Exactly one of exact / prefix / regex (RE2)."""

    exact: str | None = None
    prefix: str | None = None
    regex: str | None = None

    @model_validator(mode="after")
    def _one(self) -> StringMatch:
        if sum(v is not None for v in (self.exact, self.prefix, self.regex)) != 1:
            raise ValueError("a string match needs exactly one of exact, prefix, regex")
        return self


class HTTPMatchRequest(IstioModel):
    name: str | None = None
    uri: StringMatch | None = None
    headers: dict[str, StringMatch] = Field(default_factory=dict)


class PortSelector(IstioModel):
    number: int = Field(ge=1, le=65535)


class Destination(IstioModel):
    host: str
    subset: str | None = None
    port: PortSelector | None = None


class HTTPRouteDestination(IstioModel):
    destination: Destination
    weight: int | None = Field(None, ge=0)


class HTTPRetry(IstioModel):
    attempts: int = Field(ge=0)
    per_try_timeout: Duration | None = None
    retry_on: str | None = None


class Percent(IstioModel):
    value: float = Field(ge=0, le=100)


class FaultDelay(IstioModel):
    fixed_delay: Duration
    percentage: Percent | None = None


class FaultAbort(IstioModel):
    """An abort with a gRPC status name (e.g. UNAVAILABLE) or an HTTP status."""

    grpc_status: str | None = None
    http_status: int | None = None
    percentage: Percent | None = None

    @model_validator(mode="after")
    def _one(self) -> FaultAbort:
        if (self.grpc_status is None) == (self.http_status is None):
            raise ValueError("an abort needs exactly one of grpcStatus, httpStatus")
        return self


class HTTPFaultInjection(IstioModel):
    delay: FaultDelay | None = None
    abort: FaultAbort | None = None


class HeaderOperations(IstioModel):
    """Headers removed from the request before it is forwarded (`set` and `add` are not supported locally)."""

    remove: list[str] = Field(default_factory=list)


class Headers(IstioModel):
    request: HeaderOperations | None = None


class HTTPRoute(IstioModel):
    name: str | None = None
    match: list[HTTPMatchRequest] = Field(default_factory=list)
    route: list[HTTPRouteDestination] = Field(min_length=1)
    timeout: Duration | None = None
    retries: HTTPRetry | None = None
    fault: HTTPFaultInjection | None = None
    headers: Headers | None = None


class VirtualServiceSpec(IstioModel):
    hosts: list[str] = Field(min_length=1)
    gateways: list[str] = Field(default_factory=list)
    http: list[HTTPRoute] = Field(min_length=1)
    export_to: list[str] = Field(default_factory=list)


# -- DestinationRule ---------------------------------------------------------------------------------------


class LocalityLoadBalancerSetting(IstioModel):
    """Only `enabled` (no `failover`, `distribute`): a policy that may fail over to another locality is refused, as
    it could carry traffic to a tier that must not see it."""

    enabled: bool | None = None


class LoadBalancerSettings(IstioModel):
    simple: Literal["UNSPECIFIED", "LEAST_REQUEST", "ROUND_ROBIN", "RANDOM", "PASSTHROUGH", "LEAST_CONN"] = (
        "UNSPECIFIED"
    )
    locality_lb_setting: LocalityLoadBalancerSetting | None = None


class TCPSettings(IstioModel):
    max_connections: int | None = Field(None, ge=1)
    connect_timeout: Duration | None = None


class HTTPSettings(IstioModel):
    http1_max_pending_requests: int | None = Field(None, ge=1)
    http2_max_requests: int | None = Field(None, ge=1)
    max_requests_per_connection: int | None = Field(None, ge=0)
    max_retries: int | None = Field(None, ge=0)
    idle_timeout: Duration | None = None


class ConnectionPoolSettings(IstioModel):
    tcp: TCPSettings | None = None
    http: HTTPSettings | None = None


class OutlierDetection(IstioModel):
    """Istio's OutlierDetection. Without `splitExternalLocalOriginErrors` Envoy counts its own failures to reach a
    host (a timeout as 504, a refused or reset connection as 503) with the host's answers in both consecutive
    counters; with it they count only in `consecutiveLocalOriginFailures`."""

    split_external_local_origin_errors: bool = False
    consecutive_local_origin_failures: int | None = Field(None, ge=0)
    consecutive_gateway_errors: int | None = Field(None, ge=0)
    consecutive_5xx_errors: int | None = Field(None, ge=0, alias="consecutive5xxErrors")
    interval: Duration | None = None
    base_ejection_time: Duration | None = None
    max_ejection_percent: int | None = Field(None, ge=0, le=100)
    min_health_percent: int | None = Field(None, ge=0, le=100)


class ClientTLSSettings(IstioModel):
    """TLS a client originates: SIMPLE (verify the server) to an external host; locally the CA is the topology's."""

    mode: Literal["DISABLE", "SIMPLE", "MUTUAL", "ISTIO_MUTUAL"]
    sni: str | None = None
    subject_alt_names: list[str] = Field(default_factory=list)
    credential_name: str | None = None
    ca_certificates: str | None = None


class TrafficPolicy(IstioModel):
    load_balancer: LoadBalancerSettings | None = None
    connection_pool: ConnectionPoolSettings | None = None
    outlier_detection: OutlierDetection | None = None
    tls: ClientTLSSettings | None = None


class Subset(IstioModel):
    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    traffic_policy: TrafficPolicy | None = None


class DestinationRuleSpec(IstioModel):
    host: str
    traffic_policy: TrafficPolicy | None = None
    subsets: list[Subset] = Field(default_factory=list)
    export_to: list[str] = Field(default_factory=list)


# -- ServiceEntry --------------------------------------------------------------------------------------------


class ServicePort(IstioModel):
    number: int = Field(ge=1, le=65535)
    name: str = Field(min_length=1)
    protocol: Literal["HTTP", "HTTP2", "GRPC", "HTTPS", "TLS", "TCP"] | None = None
    target_port: int | None = Field(None, ge=1, le=65535)


class ServiceEntrySpec(IstioModel):
    """A host outside the mesh (the cloud tier's ingress, as the edge sees it)."""

    hosts: list[str] = Field(min_length=1)
    location: Literal["MESH_EXTERNAL", "MESH_INTERNAL"] = "MESH_EXTERNAL"
    resolution: Literal["NONE", "STATIC", "DNS", "DNS_ROUND_ROBIN"] = "NONE"
    ports: list[ServicePort] = Field(min_length=1)
    export_to: list[str] = Field(default_factory=list)


# -- Gateway, security, telemetry -----------------------------------------------------------------------


class GatewayPort(IstioModel):
    number: int = Field(ge=1, le=65535)
    name: str
    protocol: Literal["HTTP", "HTTP2", "GRPC", "HTTPS"]


class ServerTLSSettings(IstioModel):
    """TLS terminated at the gateway with the certificate of a Kubernetes secret (only mode SIMPLE locally)."""

    mode: Literal["SIMPLE"]
    credential_name: str = Field(min_length=1)


class Server(IstioModel):
    port: GatewayPort
    hosts: list[str] = Field(min_length=1)
    name: str | None = None
    tls: ServerTLSSettings | None = None

    @model_validator(mode="after")
    def _tls_matches_protocol(self) -> Server:
        if (self.port.protocol == "HTTPS") != (self.tls is not None):
            raise ValueError("an HTTPS server needs `tls`, and `tls` needs protocol HTTPS")
        return self


class GatewaySpec(IstioModel):
    selector: dict[str, str] = Field(default_factory=dict)
    servers: list[Server] = Field(min_length=1)


class WorkloadSelector(IstioModel):
    match_labels: dict[str, str] = Field(default_factory=dict)


class MutualTLS(IstioModel):
    mode: Literal["UNSET", "DISABLE", "PERMISSIVE", "STRICT"]


class PeerAuthenticationSpec(IstioModel):
    selector: WorkloadSelector | None = None
    mtls: MutualTLS | None = None


class Source(IstioModel):
    principals: list[str] = Field(default_factory=list)
    namespaces: list[str] = Field(default_factory=list)
    request_principals: list[str] = Field(default_factory=list)
    not_request_principals: list[str] = Field(default_factory=list)


class RuleFrom(IstioModel):
    source: Source


class Operation(IstioModel):
    methods: list[str] = Field(default_factory=list)
    paths: list[str] = Field(default_factory=list)
    ports: list[str] = Field(default_factory=list)


class RuleTo(IstioModel):
    operation: Operation


class Condition(IstioModel):
    """A `when` condition: the attribute `key` (e.g. request.headers[x-name]) has one of `values`, none of
    `notValues`."""

    key: str = Field(min_length=1)
    values: list[str] = Field(default_factory=list)
    not_values: list[str] = Field(default_factory=list)


class Rule(IstioModel):
    from_: list[RuleFrom] = Field(default_factory=list, alias="from")
    to: list[RuleTo] = Field(default_factory=list)
    when: list[Condition] = Field(default_factory=list)


class AuthorizationPolicySpec(IstioModel):
    selector: WorkloadSelector | None = None
    action: Literal["ALLOW", "DENY", "AUDIT", "CUSTOM"] = "ALLOW"
    rules: list[Rule] = Field(default_factory=list)


class ClaimToHeader(IstioModel):
    header: str = Field(min_length=1, pattern=r"^[-_A-Za-z0-9]+$")
    claim: str = Field(min_length=1)


class JWTRule(IstioModel):
    """One issuer's tokens: where its keys are (inline JWKS only locally), audiences, what reaches the upstream."""

    issuer: str = Field(min_length=1)
    audiences: list[str] = Field(default_factory=list)
    jwks: str | None = None
    forward_original_token: bool = False
    output_claim_to_headers: list[ClaimToHeader] = Field(default_factory=list)


class RequestAuthenticationSpec(IstioModel):
    selector: WorkloadSelector | None = None
    jwt_rules: list[JWTRule] = Field(default_factory=list)


class SubFilterMatch(IstioModel):
    name: str


class FilterMatch(IstioModel):
    name: str
    sub_filter: SubFilterMatch | None = None


class FilterChainMatch(IstioModel):
    filter: FilterMatch


class ListenerMatch(IstioModel):
    filter_chain: FilterChainMatch


class EnvoyConfigObjectMatch(IstioModel):
    context: Literal["ANY", "SIDECAR_INBOUND", "SIDECAR_OUTBOUND", "GATEWAY"]
    listener: ListenerMatch


class Patch(IstioModel):
    operation: Literal["MERGE", "ADD", "REMOVE", "INSERT_BEFORE", "INSERT_AFTER", "INSERT_FIRST", "REPLACE"]
    value: dict[str, Any] = Field(default_factory=dict)
    """Envoy configuration as Envoy spells it (snake_case), not Istio's camelCase."""


class EnvoyConfigObjectPatch(IstioModel):
    apply_to: Literal[
        "LISTENER",
        "FILTER_CHAIN",
        "NETWORK_FILTER",
        "HTTP_FILTER",
        "ROUTE_CONFIGURATION",
        "VIRTUAL_HOST",
        "HTTP_ROUTE",
        "CLUSTER",
        "EXTENSION_CONFIG",
        "BOOTSTRAP",
        "LISTENER_FILTER",
    ]
    match: EnvoyConfigObjectMatch
    patch: Patch


class EnvoyFilterWorkloadSelector(IstioModel):
    labels: dict[str, str] = Field(default_factory=dict)


class EnvoyFilterSpec(IstioModel):
    workload_selector: EnvoyFilterWorkloadSelector | None = None
    config_patches: list[EnvoyConfigObjectPatch] = Field(min_length=1)


class ProviderRef(IstioModel):
    name: str


class Tracing(IstioModel):
    providers: list[ProviderRef] = Field(default_factory=list)
    random_sampling_percentage: float | None = Field(None, ge=0, le=100)
    disable_span_reporting: bool | None = None


class TelemetrySpec(IstioModel):
    selector: WorkloadSelector | None = None
    tracing: list[Tracing] = Field(default_factory=list)


# -- resources ----------------------------------------------------------------------------------------------


class Resource(IstioModel):
    """One Istio object as read from a file; `source` is where it came from (for error messages)."""

    api_version: str
    kind: str
    metadata: Metadata
    source: Path = Field(Path("?"), exclude=True)


class VirtualService(Resource):
    api_version: Literal["networking.istio.io/v1", "networking.istio.io/v1beta1", "networking.istio.io/v1alpha3"]
    kind: Literal["VirtualService"]
    spec: VirtualServiceSpec


class DestinationRule(Resource):
    api_version: Literal["networking.istio.io/v1", "networking.istio.io/v1beta1", "networking.istio.io/v1alpha3"]
    kind: Literal["DestinationRule"]
    spec: DestinationRuleSpec


class Gateway(Resource):
    api_version: Literal["networking.istio.io/v1", "networking.istio.io/v1beta1", "networking.istio.io/v1alpha3"]
    kind: Literal["Gateway"]
    spec: GatewaySpec


class PeerAuthentication(Resource):
    api_version: Literal["security.istio.io/v1", "security.istio.io/v1beta1"]
    kind: Literal["PeerAuthentication"]
    spec: PeerAuthenticationSpec


class AuthorizationPolicy(Resource):
    api_version: Literal["security.istio.io/v1", "security.istio.io/v1beta1"]
    kind: Literal["AuthorizationPolicy"]
    spec: AuthorizationPolicySpec


class RequestAuthentication(Resource):
    api_version: Literal["security.istio.io/v1", "security.istio.io/v1beta1"]
    kind: Literal["RequestAuthentication"]
    spec: RequestAuthenticationSpec


class EnvoyFilter(Resource):
    api_version: Literal["networking.istio.io/v1alpha3"]
    kind: Literal["EnvoyFilter"]
    spec: EnvoyFilterSpec


class ServiceEntry(Resource):
    api_version: Literal["networking.istio.io/v1", "networking.istio.io/v1beta1", "networking.istio.io/v1alpha3"]
    kind: Literal["ServiceEntry"]
    spec: ServiceEntrySpec


class Telemetry(Resource):
    api_version: Literal["telemetry.istio.io/v1", "telemetry.istio.io/v1alpha1"]
    kind: Literal["Telemetry"]
    spec: TelemetrySpec


KINDS: dict[str, type[Resource]] = {
    cls.__name__: cls
    for cls in (
        VirtualService,
        DestinationRule,
        Gateway,
        PeerAuthentication,
        AuthorizationPolicy,
        RequestAuthentication,
        EnvoyFilter,
        Telemetry,
        ServiceEntry,
    )
}

NOT_APPLICABLE_LOCALLY: dict[str, str] = {
    "PeerAuthentication": "mutual TLS between sidecars needs workload certificates; the local Envoy and services "
    "talk plaintext on 127.0.0.1",
    "AuthorizationPolicy": "policies of sidecars (a selector that does not pick the ingress gateway): service-account "
    "principals exist only with mTLS identities in a cluster; locally every caller on 127.0.0.1 is allowed. Policies "
    "of the ingress gateway are rendered (Envoy RBAC on the ingress listener)",
    "Gateway.spec.selector": "picks the ingress-gateway pods; locally the ingress is the topology's `ingress` address",
    "Gateway.spec.servers": "port and hosts of the cluster ingress; locally one listener on the topology's `ingress` "
    "address accepts every host",
    "Gateway.spec.servers.tls.credentialName": "the Kubernetes secret holding the certificate; locally the files of "
    "the topology's `ingress_tls` (without them the local ingress is plaintext)",
    "RequestAuthentication.spec.selector, AuthorizationPolicy.spec.selector, EnvoyFilter.spec.workloadSelector": "pick "
    "the ingress-gateway pods; locally they apply to the ingress listener",
    "*.metadata.namespace (ingress-gateway policies)": "in a cluster they live in the gateway's namespace "
    "(istio-system); the local mesh has a single namespace",
    "Telemetry.spec.selector": "workload scoping; locally the tracing settings apply to every listener",
    "Telemetry.spec.tracing.providers": "the provider (meshConfig extensionProviders) is the topology's `otlp` "
    "collector address; without one the local Envoy forwards trace headers but exports no spans",
    "*.metadata.namespace/labels/annotations": "the local mesh has a single namespace",
    "*.spec.exportTo": "visibility across namespaces; the local mesh has a single namespace",
    "Destination.port": "a service has one gRPC port; locally its listener is the topology's `listen` address",
    "ServiceEntry.spec.location/resolution/ports": "how the sidecar reaches the external host; locally the host is "
    "the topology's `egress.cloud_ingress` address, reached from the `egress.listen` listener",
    "DestinationRule.trafficPolicy.tls (ServiceEntry host)": "SIMPLE: the egress originates TLS, trusting the "
    "topology's `egress.tls_ca` (without one the local cloud ingress is plaintext); sni/subjectAltNames/"
    "credentialName/caCertificates name the real cloud host and secret",
    "DestinationRule.trafficPolicy.tls (mesh services)": "mutual TLS between sidecars needs workload certificates",
    "DestinationRule.trafficPolicy.loadBalancer.localityLbSetting": "one machine is one locality (`failover` and "
    "`distribute` are refused: no locality failover)",
}
"""Fields accepted from `istio/` that mean nothing on one machine, with why; everything else is translated."""
