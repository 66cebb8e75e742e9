"""EnvoyFilter patches of the ingress gateway applied to the ingress listener's HttpConnectionManager.

Two shapes are supported, the two istio/ uses: an HTTP filter inserted before a filter of the chain (HTTP_FILTER
INSERT_BEFORE a subFilter, how Istio users add a local rate limit), and fields merged into the connection manager
(NETWORK_FILTER MERGE of its typed_config, how they set its timeouts). Any other patch is a MeshConfigError, and so
is a patch whose target is missing (Istio would skip it without a word). Merging follows protobuf's merge as Istio
does: messages field by field, repeated fields appended, scalars replaced; Envoy then validates the result.
"""

from __future__ import annotations

import copy
from typing import Any

from services.mesh.errors import MeshConfigError
from services.mesh.gateways import selects_ingress
from services.mesh.istio import EnvoyConfigObjectPatch
from services.mesh.loader import IstioConfig

HCM_FILTER = "envoy.filters.network.http_connection_manager"
HCM_TYPE = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
SUPPORTED = (
    f"HTTP_FILTER INSERT_BEFORE a subFilter of {HCM_FILTER}, or NETWORK_FILTER MERGE into {HCM_FILTER}'s "
    "typed_config, both with context GATEWAY"
)

Patches = list[tuple[EnvoyConfigObjectPatch, str]]


def ingress_patches(istio: IstioConfig) -> Patches:
    """(patch, where) of every EnvoyFilter, in file order; each must select the ingress gateway."""
    out: Patches = []
    for ef in istio.envoy_filters:
        where = f"{ef.source}: EnvoyFilter '{ef.metadata.name}'"
        labels = ef.spec.workload_selector.labels if ef.spec.workload_selector else None
        if not selects_ingress(istio, labels, f"{where}: spec.workloadSelector"):
            raise MeshConfigError(
                f"{where}: spec.workloadSelector: only EnvoyFilters of the ingress gateway are supported"
            )
        out.extend((patch, f"{where}: spec.configPatches.{i}") for i, patch in enumerate(ef.spec.config_patches))
    return out


def merge(target: dict[str, Any], value: dict[str, Any], where: str) -> None:
    """protobuf merge of JSON-shaped messages: nested messages merged, lists appended, scalars replaced."""
    for key, new in value.items():
        old = target.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            if "@type" in old or "@type" in new:
                raise MeshConfigError(f"{where}: patch.value: {key}: merging into a typed (Any) field is not supported")
            merge(old, new, f"{where}.{key}")
        elif isinstance(old, list) and isinstance(new, list):
            old.extend(copy.deepcopy(new))
        else:
            target[key] = copy.deepcopy(new)


def apply_patches(hcm: dict[str, Any], patches: Patches) -> None:
    """Apply `patches`, in order, to the ingress HttpConnectionManager config `hcm` (in place)."""
    for patch, where in patches:
        match = patch.match
        sub = match.listener.filter_chain.filter.sub_filter
        operation = (patch.apply_to, patch.patch.operation)
        if match.context != "GATEWAY" or match.listener.filter_chain.filter.name != HCM_FILTER:
            raise MeshConfigError(f"{where}: match: the local mesh supports {SUPPORTED}")
        value = patch.patch.value
        if operation == ("HTTP_FILTER", "INSERT_BEFORE") and sub is not None:
            names = [f["name"] for f in hcm["http_filters"]]
            if sub.name not in names:
                raise MeshConfigError(
                    f"{where}: match...subFilter.name: no filter {sub.name!r} on the ingress ({names})"
                )
            if set(value) != {"name", "typed_config"} or "@type" not in value["typed_config"]:
                raise MeshConfigError(f"{where}: patch.value: an HTTP filter needs exactly `name` and a typed_config")
            hcm["http_filters"].insert(names.index(sub.name), copy.deepcopy(value))
        elif operation == ("NETWORK_FILTER", "MERGE") and sub is None:
            config = value.get("typed_config")
            if set(value) != {"typed_config"} or not isinstance(config, dict) or config.get("@type") != HCM_TYPE:
                raise MeshConfigError(f"{where}: patch.value: needs exactly a typed_config of type {HCM_TYPE}")
            merge(hcm, {k: v for k, v in config.items() if k != "@type"}, where)
        else:
            applied = f"{patch.apply_to} {patch.patch.operation}" + (" with a subFilter" if sub else "")
            raise MeshConfigError(f"{where}: {applied}: the local mesh supports {SUPPORTED}")
