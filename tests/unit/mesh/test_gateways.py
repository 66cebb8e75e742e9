"""Which half of the mesh a selector picks: the ingress gateway's pods or the sidecars; none is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.mesh.errors import MeshConfigError
from services.mesh.gateways import selects_ingress
from services.mesh.loader import load_istio

ISTIO = Path(__file__).resolve().parents[3] / "istio"


def test_the_gateway_selector_picks_the_ingress_and_app_labels_pick_sidecars() -> None:
    istio = load_istio([ISTIO])
    assert selects_ingress(istio, {"istio": "ingressgateway"}, "policy")
    assert not selects_ingress(istio, {"app": "model"}, "policy")


def test_a_resource_without_selector_is_refused() -> None:
    with pytest.raises(MeshConfigError, match="no workload selector"):
        selects_ingress(load_istio([ISTIO]), None, "AuthorizationPolicy x")
