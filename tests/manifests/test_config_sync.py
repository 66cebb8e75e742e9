"""The ConfigMap copies under k8s/base/config/ match pipelines/ and features/ byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.manifests.support import REPO, Doc, find

CONFIG = REPO / "k8s" / "base" / "config"
# (repository folder, copy folder, glob, ConfigMap name prefix)
SYNCED = [
    (REPO / "pipelines", CONFIG / "pipelines", "*.yaml", "pipelines-"),
    (REPO / "features", CONFIG / "features", "*.yaml", "feature-sets-"),
    (REPO / "features" / "tables", CONFIG / "features" / "tables", "*.csv", "feature-tables-"),
]


def names(folder: Path, pattern: str) -> set[str]:
    return {p.name for p in folder.glob(pattern)}


@pytest.mark.parametrize(("source", "copy", "pattern", "prefix"), SYNCED, ids=[s[3].rstrip("-") for s in SYNCED])
def test_copies_match_the_repository(
    source: Path, copy: Path, pattern: str, prefix: str, builds: dict[str, list[Doc]]
) -> None:
    src, dst = source.relative_to(REPO), copy.relative_to(REPO)
    fix = f"fix: rm -f {dst}/{pattern} && cp {src}/{pattern} {dst}/"
    assert names(source, pattern), f"nothing to sync in {source}"
    assert names(copy, pattern) == names(source, pattern), fix
    stale = sorted(n for n in names(source, pattern) if (source / n).read_bytes() != (copy / n).read_bytes())
    assert not stale, f"{stale} differ; {fix}"
    # ... and the kustomization lists every copy (a copied but unlisted file would not be deployed).
    (config_map,) = [d for d in find(builds["dev"], "ConfigMap") if d["metadata"]["name"].startswith(prefix)]
    assert set(config_map["data"]) == names(source, pattern), "list the file in k8s/base/kustomization.yaml"
    for n in names(source, pattern):
        assert config_map["data"][n] == (source / n).read_text()
