"""`meshserve canary`: show or change the running local mesh's canary split (v1/v2) without a restart."""

from __future__ import annotations

from pathlib import Path

from services.cli.stack.layout import MESH_DIR


class CanaryError(ValueError):
    """A bad weight specification, or no local mesh to change."""


def parse_weights(text: str) -> dict[str, int]:
    """'v1=90,v2=10' to {'v1': 90, 'v2': 10}."""
    weights: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        subset, sep, value = part.partition("=")
        if not sep or not subset.strip() or not value.strip().isdigit():
            raise CanaryError(f"expected subset=weight pairs such as v1=90,v2=10; got {part!r}")
        weights[subset.strip()] = int(value)
    if not weights:
        raise CanaryError("no weights given")
    return weights


def change(
    log_dir: Path,
    service: str = "model",
    weights: dict[str, int] | None = None,
    promote: bool = False,
    rollback: bool = False,
) -> dict[str, int]:
    """Apply at most one change to the mesh `meshserve up` runs with this log dir; the split in force."""
    from services.mesh import LocalMesh, MeshConfigError

    try:
        mesh = LocalMesh.attach(log_dir / MESH_DIR)
        if promote:
            return mesh.promote(service)
        if rollback:
            return mesh.rollback(service)
        if weights is not None:
            return mesh.set_weights(service, weights)
        return mesh.weights(service)
    except MeshConfigError as e:
        raise CanaryError(f"{e} (is `meshserve up` running with --log-dir {log_dir} and the mesh?)") from None
