"""Istio host names (`model`, `model.meshserve.svc.cluster.local`) to topology service names, and cluster names."""

from __future__ import annotations

NAMESPACE = "meshserve"
_SUFFIXES = (f".{NAMESPACE}.svc.cluster.local", f".{NAMESPACE}.svc", f".{NAMESPACE}")


def service_of(host: str) -> str:
    """The short service name of an Istio host in the meshserve namespace."""
    for suffix in _SUFFIXES:
        if host.endswith(suffix):
            return host[: -len(suffix)]
    return host


def cluster_name(service: str, subset: str | None) -> str:
    """Istio's naming, so stats read the same locally and in a cluster: `outbound|grpc|v1|model`."""
    return f"outbound|grpc|{subset or ''}|{service}"
