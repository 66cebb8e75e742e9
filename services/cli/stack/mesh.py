"""The local stack's mesh: the topology services.mesh renders istio/ for, Envoy's configuration, and the wait until
Envoy counts every replica healthy."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from services.cli.stack.layout import StackLayout
from services.cli.stack.supervisor import StackError

if TYPE_CHECKING:
    from services.cli.stack.credentials import StackSecrets
    from services.mesh import LocalMesh, MeshTopology


def mesh_topology(layout: StackLayout, secrets: StackSecrets | None = None) -> MeshTopology:
    """The mesh's view of the stack: each service's endpoints with their subset labels (the model's initial replicas;
    the service is dynamic when a group autoscales, its endpoints then changed live), listeners, ingress, admin;
    unless the layout is insecure, the ingress's TLS certificate and the JWKS of the stack's signing key (from
    `secrets`, which a secure layout needs); with `secrets`, insecure or not, the internal credential Envoy sends the
    trace store."""
    from services.mesh import MeshEndpoint, MeshService, MeshTopology

    t = layout
    endpoints = {
        "gateway": [(t.service_address(g.name, g.port), "v1") for g in t.gateways],
        "model": [(t.replica_address(r), r.subset) for r in t.initial_replicas],
        "feature": [(t.service_address("feature", t.feature_port), "v1")],
        "cache": [(t.service_address("cache", t.cache_port), "v1")],
    }
    dynamic = {"model"} if t.autoscaled else set()
    security: dict[str, object] = {"authenticate": False, "ingress_tls": None}
    if not t.insecure:
        from services.common.tokens import LOCAL_ISSUER
        from services.mesh.topology import IngressTls

        if secrets is None:
            raise ValueError("a secure ingress needs the stack's secrets (its certificate and JWKS)")
        security = {
            "authenticate": True,
            "ingress_tls": IngressTls(cert_chain=secrets.ingress_cert, private_key=secrets.ingress_key),
            "jwks": {LOCAL_ISSUER: secrets.jwks()},
        }
    return MeshTopology(
        services={
            name: MeshService(
                listen=t.mesh_address(name),
                replicas=[MeshEndpoint(address=a, labels={"version": v}) for a, v in addresses],
                dynamic=name in dynamic,
            )
            for name, addresses in endpoints.items()
        },
        ingress=t.address(t.ingress_port),
        admin=t.admin,
        otlp=t.address(t.traces_port) if t.traces_port else None,
        otlp_token_file=secrets.internal_token_file if secrets is not None and t.traces_port else None,
        access_log=t.tracing_mode == "retroactive",
        **security,
    )


def prepare_mesh(layout: StackLayout, workdir: Path, secrets: StackSecrets | None = None) -> LocalMesh:
    """Render Envoy's configuration from istio/ for the stack into `workdir`; the mesh, whose Envoy command the
    supervisor runs and whose dynamic endpoints the autoscaler changes."""
    from services.mesh import LocalMesh

    mesh = LocalMesh(mesh_topology(layout, secrets), layout.istio_paths, workdir)
    mesh.overrides.update(served_splits(mesh, {"model": {g.subset for g in layout.groups}}))
    mesh.render()
    return mesh


def render_mesh(layout: StackLayout, workdir: Path, secrets: StackSecrets | None = None) -> list[str]:
    """Render Envoy's configuration from istio/ for the stack into `workdir`; Envoy's command line."""
    return prepare_mesh(layout, workdir, secrets).envoy.command


def served_splits(mesh: LocalMesh, subsets: dict[str, set[str]] | None = None) -> dict[str, dict[str, int]]:
    """Per service whose split (as istio/ declares it) gives a share to a subset nothing serves (the canary of a
    stack started with `--no-canary`): the split with that share moved to the served subset with the largest share,
    so that no request goes where nothing answers and `meshserve canary show` says what is in force. The stack labels
    each replica with its subset as `version`, which the DestinationRule's subsets select. A service's subsets are
    those of its replicas, and those `subsets` names for it (a group that may be at zero replicas now)."""
    out = {}
    for name, service in mesh.topology.services.items():
        weights = mesh.weights(name)
        served = {replica.labels.get("version") for replica in service.replicas} | (subsets or {}).get(name, set())
        kept = {subset: w for subset, w in weights.items() if subset in served}
        lost = sum(w for subset, w in weights.items() if subset not in served)
        if not kept or not lost:
            continue
        target = max(kept, key=lambda subset: kept[subset])
        out[name] = {subset: kept.get(subset, 0) + (lost if subset == target else 0) for subset in weights}
    return out


def endpoints(layout: StackLayout) -> dict[str, set[str]]:
    """Per service of the mesh, the addresses of its replicas at start (host:port or unix:/path)."""
    t = layout
    return {
        "gateway": {t.service_address(g.name, g.port) for g in t.gateways},
        "model": {t.replica_address(r) for r in t.initial_replicas},
        "feature": {t.service_address("feature", t.feature_port)},
        "cache": {t.service_address("cache", t.cache_port)},
    }


def out_of_rotation(admin_address: str, expected: dict[str, set[str]]) -> list[str]:
    """'service address' of every replica (host:port or unix:/path) that Envoy's active health checks do not (yet)
    count healthy."""
    from services.mesh.admin import EnvoyAdmin
    from services.mesh.hosts import cluster_name
    from services.mesh.topology import host_key

    admin = EnvoyAdmin(admin_address)
    out = []
    for service, addresses in expected.items():
        try:
            hosts = admin.hosts(cluster_name(service, None))
        except OSError:
            hosts = {}
        out += [
            f"{service} {a}" for a in sorted(addresses) if hosts.get(host_key(a), {}).get("health_flags") != "healthy"
        ]
    return out


async def wait_in_rotation(layout: StackLayout, timeout_s: float) -> None:
    """Until Envoy counts every replica of every service healthy, so that the ingress and the gateway's calls
    spread over all of them from the first request; StackError naming the others after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    expected = endpoints(layout)
    while missing := await asyncio.to_thread(out_of_rotation, layout.admin, expected):
        if loop.time() > deadline:
            raise StackError(f"not in Envoy's rotation after {timeout_s:.0f}s: {', '.join(missing)}")
        await asyncio.sleep(0.2)
