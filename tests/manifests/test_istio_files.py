"""Every file under istio/ (the component and its test-only variants) passes the strict CRD schemas, and each variant
replaces resources the component has (a variant naming nothing would add a resource instead of replacing one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.manifests.support import REPO, crd_errors, is_crd_kind, load_docs, load_file

ISTIO = REPO / "istio"
ISTIO_FILES = sorted(p for p in ISTIO.rglob("*.yaml") if p.name != "kustomization.yaml") if ISTIO.is_dir() else []


def test_istio_folder_has_resources() -> None:
    assert ISTIO_FILES, f"no Istio resources under {ISTIO}"


@pytest.mark.usefixtures("schemas_dir")
@pytest.mark.parametrize("path", ISTIO_FILES, ids=[str(p.relative_to(ISTIO)) for p in ISTIO_FILES])
def test_istio_file_passes_strict_crd_schemas(path: Path) -> None:
    docs = load_file(path)
    assert docs, f"{path}: no documents"
    errors = []
    for doc in docs:
        assert is_crd_kind(doc), f"{path}: {doc.get('apiVersion')} {doc.get('kind')} is not an Istio kind"
        errors += crd_errors(doc)
    assert not errors, "\n".join(errors)


VARIANTS = sorted((ISTIO / "variants").glob("*.yaml")) if ISTIO.is_dir() else []


@pytest.mark.parametrize("path", VARIANTS, ids=[p.name for p in VARIANTS])
def test_variant_replaces_resources_of_the_component(path: Path) -> None:
    listed = load_docs((ISTIO / "kustomization.yaml").read_text())[0]["resources"]
    component = {(d["kind"], d["metadata"]["name"]) for name in listed for d in load_file(ISTIO / name)}
    for doc in load_file(path):
        assert (doc["kind"], doc["metadata"]["name"]) in component, (
            f"{path.name}: {doc['kind']} {doc['metadata']['name']}"
        )
