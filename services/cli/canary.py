"""`meshserve canary`: show or change the running local mesh's canary split (v1/v2) without a restart."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from services.cli.stack.layout import MESH_DIR

if TYPE_CHECKING:
    from services.mesh import LocalMesh


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
    """Apply at most one change to the mesh `meshserve up` runs with this log dir; the split in force.

    A share for a subset no replica of the stack serves (the canary of `meshserve up --no-canary`) is refused.
    """
    from services.mesh import LocalMesh, MeshConfigError

    wanted = {"v2": 100} if promote else {"v1": 100} if rollback else weights
    try:
        mesh = LocalMesh.attach(log_dir / MESH_DIR)
        if wanted is None:
            return mesh.weights(service)
        refuse_unserved(mesh, service, wanted, scaled_subsets(log_dir) if service == "model" else set())
        return mesh.set_weights(service, wanted)
    except MeshConfigError as e:
        raise CanaryError(f"{e} (is `meshserve up` running with --log-dir {log_dir} and the mesh?)") from None


def scaled_subsets(log_dir: Path) -> set[str]:
    """The model subsets of the stack in `log_dir` (from its stack.json), running or asleep at zero replicas."""
    from services.cli.stack.state import read_state

    state = read_state(log_dir) or {}
    return {str(g.get("subset")) for g in state.get("groups") or [] if isinstance(g, dict)}


def refuse_unserved(mesh: LocalMesh, service: str, weights: dict[str, int], asleep: set[str] | None = None) -> None:
    """CanaryError when `weights` give a share to a subset of the split that no replica of `service` serves and that
    is not among `asleep` (subsets whose replicas the stack starts on demand); a subset the split does not know is
    LocalMesh.set_weights's error."""
    split = mesh.subsets(service)  # MeshConfigError for a service the mesh does not know
    served = {r.labels.get("version") for r in mesh.topology.services[service].replicas} | (asleep or set())
    unserved = sorted(subset for subset, w in weights.items() if w > 0 and subset in split and subset not in served)
    if unserved:
        raise CanaryError(
            f"{service}: no replica serves {', '.join(unserved)} in this stack (started with --no-canary?); "
            f"its replicas serve {', '.join(sorted(s for s in served if s)) or 'nothing'}"
        )
