"""Loading istio/: the real folder parses, variants replace by name, unsupported kinds/fields name file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.mesh.errors import MeshConfigError
from services.mesh.istio import NOT_APPLICABLE_LOCALLY
from services.mesh.loader import load_istio
from tests.unit.mesh.conftest import ISTIO, dr, vs


def test_real_istio_folder_loads_every_resource() -> None:
    config = load_istio([ISTIO])
    kinds = sorted({kind for kind, _ in config.resources})
    assert kinds == [
        "AuthorizationPolicy",
        "DestinationRule",
        "EnvoyFilter",
        "Gateway",
        "PeerAuthentication",
        "RequestAuthentication",
        "Telemetry",
        "VirtualService",
    ]
    assert {v.metadata.name for v in config.virtual_services} == {"ingress", "model", "feature", "cache"}
    assert {d.metadata.name for d in config.destination_rules} == {"gateway", "model", "feature", "cache"}


def test_variant_replaces_the_resource_of_the_same_name() -> None:
    config = load_istio([ISTIO, ISTIO / "variants" / "model-fault.yaml"])
    model = next(v for v in config.virtual_services if v.metadata.name == "model")
    assert model.spec.http[0].fault is not None
    assert model.source.name == "model-fault.yaml"


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        (vs([{"route": [{"destination": {"host": "model"}}], "mirror": {"host": "x"}}]), "spec.http.0.mirror"),
        (
            vs([{"route": [{"destination": {"host": "model"}}], "retries": {"attempts": 2, "retryOnn": "x"}}]),
            "spec.http.0.retries.retryOnn",
        ),
        (dr({"host": "model", "trafficPolicy": {"outlierDetecton": {}}}), "spec.trafficPolicy.outlierDetecton"),
        (dr({"host": "model", "trafficPolicy": {"tunnel": {"protocol": "CONNECT"}}}), "spec.trafficPolicy.tunnel"),
        (vs([{"route": [{"destination": {"host": "model"}}], "timeout": "ten seconds"}]), "spec.http.0.timeout"),
    ],
)
def test_unsupported_field_is_an_error_naming_file_and_field(write_yaml, doc: dict, fragment: str) -> None:
    path = write_yaml("istio/bad.yaml", doc)
    with pytest.raises(MeshConfigError) as err:
        load_istio([path.parent])
    assert str(path) in str(err.value)
    assert fragment in str(err.value)
    assert doc["metadata"]["name"] in str(err.value)
    if "timeout" not in fragment:  # an unknown field, not a bad value
        assert f"{fragment}: field not supported by the local mesh" in str(err.value)


def test_unsupported_kind_is_an_error(write_yaml) -> None:
    doc = {"apiVersion": "networking.istio.io/v1", "kind": "Sidecar", "metadata": {"name": "x"}, "spec": {}}
    path = write_yaml("istio/se.yaml", doc)
    with pytest.raises(MeshConfigError, match=r"se\.yaml: kind 'Sidecar' \('x'\) is not supported"):
        load_istio([path])


def test_kustomization_files_and_empty_documents_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\n")
    (tmp_path / "a.yaml").write_text("---\n# only a comment\n---\n")
    assert load_istio([tmp_path]).resources == {}


def test_missing_path_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(MeshConfigError, match="no such file"):
        load_istio([tmp_path / "nope"])
    (tmp_path / "b.yaml").write_text("a: [\n")
    with pytest.raises(MeshConfigError, match=r"b\.yaml: not valid YAML"):
        load_istio([tmp_path])


def test_cluster_only_fields_are_listed_as_not_applicable() -> None:
    cluster_only = (
        "PeerAuthentication",
        "AuthorizationPolicy",
        "Gateway.spec.selector",
        "Telemetry.spec.tracing.providers",
    )
    for field in cluster_only:
        assert NOT_APPLICABLE_LOCALLY[field]
