"""`python -m services.mesh`: render or validate the Envoy configuration of istio/ for a topology, or run it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from services.mesh.errors import MeshConfigError
from services.mesh.istio import NOT_APPLICABLE_LOCALLY
from services.mesh.local import DEFAULT_WORKDIR, LocalMesh
from services.mesh.topology import MeshTopology, unix_path

EXAMPLE_TOPOLOGY = Path(__file__).resolve().parent / "example_topology.yaml"


def default_istio() -> Path:
    """`./istio` when there is one, else the repository checkout's `istio/` (so the command runs from any folder)."""
    here = Path("istio")
    return here if here.is_dir() else Path(__file__).resolve().parents[2] / "istio"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.mesh", description=__doc__)
    parser.add_argument("action", choices=["render", "validate", "run", "not-applicable"])
    parser.add_argument(
        "--topology", type=Path, help=f"topology YAML (services, replicas, listeners), e.g. {EXAMPLE_TOPOLOGY}"
    )
    parser.add_argument(
        "--istio", type=Path, nargs="+", default=[default_istio()], help="istio folders/files, in order"
    )
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="where envoy.yaml and routes/ go")
    args = parser.parse_args(argv)
    if args.action == "not-applicable":
        for field, why in NOT_APPLICABLE_LOCALLY.items():
            print(f"{field}: {why}")
        return 0
    if args.topology is None:
        parser.error(f"--topology is required (an example: {EXAMPLE_TOPOLOGY})")
    try:
        mesh = LocalMesh(MeshTopology.load(args.topology), args.istio, args.workdir)
        if args.action == "render":
            print(mesh.render())
        elif args.action == "validate":
            mesh.validate()
            print(f"{mesh.config_path}: valid")
        else:
            mesh.start()
            admin = mesh.topology.admin if unix_path(mesh.topology.admin) else f"http://{mesh.topology.admin}"
            print(f"envoy running; admin {admin}; log {mesh.envoy.log_path}", flush=True)
            try:
                return mesh.envoy.wait()
            except KeyboardInterrupt:
                mesh.stop()
    except MeshConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
