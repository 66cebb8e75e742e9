"""Whether a resource's workload selector picks the ingress gateway (the pods a Gateway selects) or sidecars."""

from __future__ import annotations

from collections.abc import Mapping

from services.mesh.errors import MeshConfigError
from services.mesh.loader import IstioConfig


def selects_ingress(istio: IstioConfig, labels: Mapping[str, str] | None, where: str) -> bool:
    """True when `labels` pick the pods of one of the Gateways (its `selector`), False when they pick sidecars.

    A resource without a selector covers its whole namespace, ingress gateway and sidecars alike: the local mesh
    cannot tell which half was meant, so it refuses rather than apply it to one and silently not the other.
    """
    if not labels:
        raise MeshConfigError(
            f"{where}: no workload selector (it would cover every workload of its namespace); the local mesh "
            "renders resources that select the ingress gateway (e.g. istio: ingressgateway) or sidecars"
        )
    return any(gw.spec.selector and labels.items() <= gw.spec.selector.items() for gw in istio.gateways)
