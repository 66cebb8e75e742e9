"""What the rendered Envoy configuration holds for the stack's closed inner surface: every JWT provider requires
`exp`, and Envoy's calls to the OTLP collector (tracer and access log) carry the internal credential, in an
envoy.yaml only its owner may read."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from services.mesh.bootstrap import render
from services.mesh.clusters import OTLP_CLUSTER
from services.mesh.errors import MeshConfigError
from services.mesh.files import write_bootstrap
from services.mesh.loader import load_istio
from tests.unit.mesh.conftest import ISTIO, topology


def grpc_services(config: Any) -> list[dict[str, Any]]:
    """Every grpc_service of `config` that calls the OTLP collector."""
    found: list[dict[str, Any]] = []
    if isinstance(config, list):
        for item in config:
            found += grpc_services(item)
    elif isinstance(config, dict):
        service = config.get("grpc_service")
        if isinstance(service, dict) and service.get("envoy_grpc", {}).get("cluster_name") == OTLP_CLUSTER:
            found.append(service)
        for value in config.values():
            found += grpc_services(value)
    return found


def bootstrap(**topo: Any) -> dict[str, Any]:
    return render(load_istio([ISTIO]), topology(**topo), Path("/tmp/routes")).bootstrap


def test_every_jwt_provider_requires_an_expiry() -> None:
    listeners = bootstrap()["static_resources"]["listeners"]
    (ingress,) = [item for item in listeners if item["name"] == "ingress"]
    text = repr(ingress)
    assert "jwt_authn" in text
    chain = ingress["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
    (jwt,) = [f["typed_config"] for f in chain if f["name"] == "envoy.filters.http.jwt_authn"]
    assert jwt["providers"] and all(p["require_expiration"] is True for p in jwt["providers"].values())


def test_envoys_otlp_calls_carry_the_internal_credential(tmp_path: Path) -> None:
    token_file = tmp_path / "internal-token"
    token_file.write_text("s3cret\n")
    plain = grpc_services(bootstrap(otlp="127.0.0.1:4317", access_log=True))
    assert plain and all("initial_metadata" not in s for s in plain)
    signed = grpc_services(bootstrap(otlp="127.0.0.1:4317", access_log=True, otlp_token_file=token_file))
    assert len(signed) == len(plain) >= 2  # the tracer and the access log of every listener
    assert all(s["initial_metadata"] == [{"key": "authorization", "value": "Bearer s3cret"}] for s in signed)
    with pytest.raises(MeshConfigError, match="otlp_token_file"):
        bootstrap(otlp="127.0.0.1:4317", otlp_token_file=tmp_path / "missing")


def test_envoy_yaml_is_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "mesh" / "envoy.yaml"
    path.parent.mkdir()
    path.write_text("old")
    path.chmod(0o644)
    write_bootstrap(path, {"admin": {}})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text().startswith("admin")
