"""Every file under istio/ (the component and its test-only variants) passes the strict CRD schemas."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.manifests.support import REPO, crd_errors, is_crd_kind, load_file

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
