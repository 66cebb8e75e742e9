"""The stack a chaos run hits: `meshserve up`'s arguments (the demo topology with the canary pinned to the versions a
hot-load adds), a channel to its ingress, and the private model repository the hot-load writes into."""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path
from typing import Any

import grpc
import yaml

from bench.chaos.script import MODEL
from bench.lib.serving import ROOT, ServerStartError

CANARY_PINS = list(range(2, 10))  # the canary replica's fraud_mlp versions: v2 and the ones hot-loaded after it


def up_options() -> set[str]:
    """The parameters `meshserve up` has in this tree (flags other helpers add land over time)."""
    from services.cli.main import up

    return set(inspect.signature(up).parameters)


def topology_file(path: Path, gateway_replicas: int, in_topology: bool) -> Path:
    """The demo topology with the canary replica pinned to CANARY_PINS of fraud_mlp (and the gateway replicas where
    the topology holds them)."""
    from services.cli.stack.topology import StackTopology

    topology = StackTopology.demo().model_dump(exclude_none=True)
    if topology.get("canary"):
        topology["canary"].setdefault("pinned_versions", {})[MODEL] = CANARY_PINS
    if in_topology:
        topology["gateway"] = {"replicas": gateway_replicas}
    path.write_text(yaml.safe_dump(topology, sort_keys=False))
    return path


def stack_arguments(
    tmp: Path, models_dir: Path, gateway_replicas: int, secure: bool = False
) -> tuple[list[str], dict[str, Any]]:
    """`meshserve up` arguments for the run and a description of the stack (what this tree could not give)."""
    from services.cli.stack.topology import StackTopology

    options = up_options()
    flag = "gateway_replicas" in options
    in_topology = not flag and "gateway" in StackTopology.model_fields
    topology = topology_file(tmp / "topology.yaml", gateway_replicas, in_topology)
    args = ["--models", str(models_dir), "--topology", str(topology)]
    described: dict[str, Any] = {"mesh": "on (Envoy ingress)"}
    if flag:
        args += ["--gateway-replicas", str(gateway_replicas)]
    if flag or in_topology:
        described["gateway replicas"] = gateway_replicas
    else:
        described["gateway replicas"] = "1 (this tree's `meshserve up` runs one)"
    if secure:
        described["ingress"] = "TLS + JWT (the stack's CA, a token minted from its key)"
    elif "insecure" in options:
        args.append("--insecure")
        described["ingress"] = "plaintext, no token (--insecure)"
    else:
        described["ingress"] = "plaintext (this tree's ingress has no TLS)"
    return args, described


def ingress_channel(log_dir: Path, ingress: str, secure: bool) -> tuple[grpc.aio.Channel, tuple[tuple[str, str], ...]]:
    """A channel to the ingress and the metadata each call carries: plaintext, or with --secure TLS trusting the
    stack's CA and a bearer token minted from its signing key (as `meshserve infer` does)."""
    if not secure:
        return grpc.aio.insecure_channel(ingress), ()
    from services.cli.connect import read_state, stack_endpoint

    state = read_state(log_dir)
    if state is None:
        raise ServerStartError(f"no stack.json in {log_dir}")
    endpoint = stack_endpoint(state, ingress, subject="chaos")
    return endpoint.aio_channel(), endpoint.metadata()


def copy_models(dest: Path, source: Path = ROOT / "models") -> Path:
    """A private copy of the model repository's models, configs and versions (the copy the hot-load writes into),
    without the build scripts beside them."""
    for model in source.iterdir():
        if (model / "config.yaml").is_file():
            shutil.copytree(model, dest / model.name, ignore=shutil.ignore_patterns("__pycache__"))
    return dest
