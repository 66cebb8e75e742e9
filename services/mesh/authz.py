"""The ingress gateway's AuthorizationPolicies to Envoy RBAC filters, translated as istiod translates them.

istiod (pilot/pkg/security/authz/builder and model) renders one RBAC filter per action, DENY before ALLOW; each rule
is a policy `ns[<namespace>]-policy[<name>]-rule[<i>]` whose permissions AND the `to` fields (values ORed) and whose
principals AND the `from` fields; a request principal `iss/sub` is matched on the payload jwt_authn stores in its
dynamic metadata; a `when` condition on a request header is a principal matching that header, after the `from`
fields. Only the fields an ingress policy can mean locally are accepted: request principals, paths, request headers.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from services.mesh.errors import MeshConfigError
from services.mesh.gateways import selects_ingress
from services.mesh.istio import AuthorizationPolicy, Condition, Rule, Source
from services.mesh.loader import IstioConfig

RBAC_FILTER = "envoy.filters.http.rbac"
RBAC_TYPE = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"
JWT_FILTER = "envoy.filters.http.jwt_authn"
JWT_PAYLOAD = "payload"
"""The key of the verified token's payload in jwt_authn's dynamic metadata (jwt_authn's payload_in_metadata)."""
ANY_AUTHENTICATED = "*"
MATCH_ANY: dict[str, Any] = {"safe_regex": {"regex": ".+"}}
# Istio's rbacPolicyMatchNever: what a policy without rules becomes (an ALLOW policy that admits nobody).
MATCH_NEVER = {"permissions": [{"not_rule": {"any": True}}], "principals": [{"not_id": {"any": True}}]}
REQUEST_HEADER = re.compile(r"^request\.headers\[([^\[\]]+)\]$")


def ingress_policies(istio: IstioConfig) -> list[AuthorizationPolicy]:
    """The AuthorizationPolicies whose selector picks the ingress gateway (sidecar ones need mTLS identities)."""
    out = []
    for policy in istio.authorization_policies:
        where = f"{policy.source}: AuthorizationPolicy '{policy.metadata.name}'"
        labels = policy.spec.selector.match_labels if policy.spec.selector else None
        if selects_ingress(istio, labels, f"{where}: spec.selector"):
            check_ingress_policy(policy, where)
            out.append(policy)
    return out


def check_ingress_policy(policy: AuthorizationPolicy, where: str) -> None:
    """MeshConfigError for what the local ingress cannot enforce (a silently skipped condition widens a policy)."""
    if policy.spec.action not in ("ALLOW", "DENY"):
        raise MeshConfigError(f"{where}: spec.action: {policy.spec.action} is not supported at the local ingress")
    for i, rule in enumerate(policy.spec.rules):
        for j, f in enumerate(rule.from_):
            if f.source.principals or f.source.namespaces:
                raise MeshConfigError(
                    f"{where}: spec.rules.{i}.from.{j}.source: principals/namespaces are mTLS peer identities, which "
                    "callers of the local ingress do not have (use requestPrincipals)"
                )
        for j, t in enumerate(rule.to):
            if t.operation.methods or t.operation.ports:
                raise MeshConfigError(
                    f"{where}: spec.rules.{i}.to.{j}.operation: only `paths` is supported at the local ingress"
                )
        for j, c in enumerate(rule.when):
            if not REQUEST_HEADER.match(c.key):
                raise MeshConfigError(
                    f"{where}: spec.rules.{i}.when.{j}.key: {c.key!r}: only request.headers[<name>] conditions are "
                    "supported at the local ingress"
                )
            if not c.values and not c.not_values:
                raise MeshConfigError(f"{where}: spec.rules.{i}.when.{j}: needs values or notValues")


def string_matcher(value: str) -> dict[str, Any]:
    """Istio's StringMatcher for a policy value: `*` any non-empty, `*x` suffix, `x*` prefix, else exact."""
    if value == "*":
        return copy.deepcopy(MATCH_ANY)
    if value.startswith("*"):
        return {"suffix": value[1:]}
    if value.endswith("*"):
        return {"prefix": value[:-1]}
    return {"exact": value}


def claim_matcher(claim: str, match: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {
            "filter": JWT_FILTER,
            "path": [{"key": JWT_PAYLOAD}, {"key": claim}],
            "value": {"string_match": copy.deepcopy(match)},
        }
    }


def request_principals(values: list[str]) -> dict[str, Any]:
    """Istio's requestPrincipalGenerator: each `iss/sub` (split at the last '/') as issuer AND subject claims."""
    ors = []
    for value in values:
        idx = value.rfind("/")
        iss, sub = (value[:idx], value[idx + 1 :]) if idx >= 0 else (value, "")
        if value == "*":
            match_iss, match_sub = MATCH_ANY, MATCH_ANY
        elif value.startswith("*"):
            if idx >= 0:
                match_iss = MATCH_ANY if iss == "*" else {"suffix": iss[1:]}
                match_sub = {"exact": sub}
            else:
                match_iss, match_sub = MATCH_ANY, {"suffix": value[1:]}
        elif value.endswith("*"):
            if idx >= 0:
                match_iss = {"exact": iss}
                match_sub = MATCH_ANY if sub == "*" else {"prefix": sub[:-1]}
            else:
                match_iss, match_sub = {"prefix": value[:-1]}, MATCH_ANY
        else:
            match_iss, match_sub = {"exact": iss}, {"exact": sub}
        ors.append({"and_ids": {"ids": [claim_matcher("iss", match_iss), claim_matcher("sub", match_sub)]}})
    return ors[0] if len(ors) == 1 else {"or_ids": {"ids": ors}}


def header_matcher(name: str, value: str) -> dict[str, Any]:
    """Istio's HeaderMatcher for a condition value: `*` present, `*x` suffix, `x*` prefix, else exact."""
    if value == "*":
        return {"header": {"name": name, "present_match": True}}
    return {"header": {"name": name, "string_match": string_matcher(value)}}


def either(ids: list[dict[str, Any]]) -> dict[str, Any]:
    return ids[0] if len(ids) == 1 else {"or_ids": {"ids": ids}}


def condition_principals(conditions: list[Condition]) -> list[dict[str, Any]]:
    """The principals ANDed for `when` conditions on request headers (values ORed, notValues negated)."""
    out: list[dict[str, Any]] = []
    for condition in conditions:
        match = REQUEST_HEADER.match(condition.key)
        assert match is not None, condition.key  # check_ingress_policy refused any other key
        name = match.group(1).lower()
        if condition.values:
            out.append(either([header_matcher(name, v) for v in condition.values]))
        if condition.not_values:
            out.append({"not_id": either([header_matcher(name, v) for v in condition.not_values])})
    return out


def waived(values: list[str], action: str, authenticate: bool) -> list[str]:
    """Without authentication at the ingress, an ALLOW rule's "any authenticated caller" admits every caller."""
    if not authenticate and action == "ALLOW" and ANY_AUTHENTICATED in values:
        return []
    return values


def rule_policy(rule: Rule, action: str, authenticate: bool) -> dict[str, Any]:
    """One rule as an RBAC policy: permissions from `to`, principals from `from` (either absent: any)."""
    permissions = []
    for paths in [t.operation.paths for t in rule.to] or [[]]:
        ands: list[dict[str, Any]] = []
        if paths:
            ands.append({"or_rules": {"rules": [{"url_path": {"path": string_matcher(p)}} for p in paths]}})
        permissions.append({"and_rules": {"rules": ands or [{"any": True}]}})
    principals = []
    for source in [f.source for f in rule.from_] or [Source()]:
        ids: list[dict[str, Any]] = []
        values = waived(source.request_principals, action, authenticate)
        if values:
            ids.append(request_principals(values))
        if source.not_request_principals:
            ids.append({"not_id": request_principals(source.not_request_principals)})
        ids.extend(condition_principals(rule.when))
        principals.append({"and_ids": {"ids": ids or [{"any": True}]}})
    return {"permissions": permissions, "principals": principals}


def policy_name(policy: AuthorizationPolicy, index: int) -> str:
    return f"ns[{policy.metadata.namespace or 'default'}]-policy[{policy.metadata.name}]-rule[{index}]"


def rbac_filters(policies: list[AuthorizationPolicy], authenticate: bool) -> list[dict[str, Any]]:
    """The RBAC HTTP filters of the ingress: one for the DENY policies, then one for the ALLOW policies."""
    out = []
    for action in ("DENY", "ALLOW"):
        chosen = [p for p in policies if p.spec.action == action]
        if not chosen:
            continue
        rules: dict[str, Any] = {}
        for policy in chosen:
            for i, rule in enumerate(policy.spec.rules):
                rules[policy_name(policy, i)] = rule_policy(rule, action, authenticate)
            if not policy.spec.rules:
                rules[policy_name(policy, 0)] = MATCH_NEVER
        out.append(
            {"name": RBAC_FILTER, "typed_config": {"@type": RBAC_TYPE, "rules": {"action": action, "policies": rules}}}
        )
    return out


def anonymous_paths(policies: list[AuthorizationPolicy]) -> list[str] | None:
    """The path patterns some ALLOW rule admits without a request principal; None when that may be any path.

    Everywhere else a request without a token can only be refused by RBAC, which answers 403 (PERMISSION_DENIED);
    services.mesh.authn asks jwt_authn for a token on those paths instead, so that it is 401 (UNAUTHENTICATED).
    None also when there is no ALLOW policy at all: then nothing needs a token (Istio's allow_missing).
    """
    allow = [p for p in policies if p.spec.action == "ALLOW"]
    if not allow:
        return None
    paths: list[str] = []
    for policy in allow:
        for rule in policy.spec.rules:
            if rule.from_ and all(f.source.request_principals for f in rule.from_):
                continue  # every source of this rule asks for a principal
            if not rule.to or any(not t.operation.paths for t in rule.to):
                return None
            paths.extend(p for t in rule.to for p in t.operation.paths)
    return paths
