"""Session fixtures for the manifest tests: each overlay is built once by kustomize and shared."""

from __future__ import annotations

import pytest

from tests.manifests.support import OVERLAYS, SCHEMAS, Doc, kustomize


@pytest.fixture(scope="session")
def builds() -> dict[str, list[Doc]]:
    """overlay name -> its `kubectl kustomize` output (built once per session)."""
    return {name: kustomize(path) for name, path in OVERLAYS.items()}


@pytest.fixture(scope="session", params=sorted(OVERLAYS))
def overlay(request: pytest.FixtureRequest, builds: dict[str, list[Doc]]) -> tuple[str, list[Doc]]:
    """Each overlay in turn: (name, documents)."""
    return request.param, builds[request.param]


@pytest.fixture(scope="session")
def schemas_dir() -> None:
    """Skips tests that need the upstream CRD schemas when shared/schemas is not beside the repo."""
    if not SCHEMAS.is_dir():
        pytest.skip(f"CRD schemas not found at {SCHEMAS} (CI checks out shared/ beside the repository)")
