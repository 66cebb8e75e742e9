"""Every overlay builds with kustomize and every resource passes its schema (core and CRD, strict)."""

from __future__ import annotations

import kubernetes_validate
import pytest

from tests.manifests.support import OVERLAYS, Doc, crd_errors, ident, is_crd_kind, kustomize

# The oldest Kubernetes the manifests support (unhealthyPodEvictionPolicy is GA in 1.31) and the newest
# kubernetes-validate ships schemas for.
KUBERNETES_VERSIONS = ("1.31", kubernetes_validate.latest_version())


def core_errors(doc: Doc, version: str) -> list[str]:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as err:
        path = ".".join(str(p) for p in err.path) or "<root>"
        return [f"{ident(doc)} (Kubernetes {version}): {path}: {err.message}"]
    except kubernetes_validate.SchemaNotFoundError as err:
        return [f"{ident(doc)}: {err.message}"]
    return []


def test_overlays_build(builds: dict[str, list[Doc]]) -> None:
    for name, docs in builds.items():
        assert docs, f"{name}: empty build"
        assert all("apiVersion" in d and "kind" in d for d in docs)


def test_base_and_adapter_build_alone() -> None:
    """The base (no mesh) and the adapter config are usable on their own."""
    base = kustomize(OVERLAYS["dev"].parents[1] / "base")
    assert not [d for d in base if is_crd_kind(d)], "the base must not need any CRD (the mesh is an overlay)"
    adapter = kustomize(OVERLAYS["dev"].parents[1] / "prometheus-adapter")
    assert [d["kind"] for d in adapter] == ["ConfigMap"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_core_resources_pass_kubernetes_validate_strict(overlay: tuple[str, list[Doc]], version: str) -> None:
    name, docs = overlay
    core = [d for d in docs if not is_crd_kind(d)]
    assert core
    errors = [e for d in core for e in core_errors(d, version)]
    assert not errors, f"{name}:\n" + "\n".join(errors)


def test_custom_resources_pass_strict_crd_schemas(overlay: tuple[str, list[Doc]], schemas_dir: None) -> None:
    name, docs = overlay
    custom = [d for d in docs if is_crd_kind(d)]
    assert custom, f"{name}: no Istio resources (is the istio/ component included?)"
    errors = [e for d in custom for e in crd_errors(d)]
    assert not errors, f"{name}:\n" + "\n".join(errors)
