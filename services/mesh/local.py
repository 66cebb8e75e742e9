"""LocalMesh: renders `istio/` for a topology into a work folder, runs Envoy, and moves canary weights and the
endpoints of dynamic services live."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from services.mesh.admin import EnvoyAdmin
from services.mesh.bootstrap import render, render_routes
from services.mesh.clusters import cluster_members, endpoints_file, load_assignment
from services.mesh.envoy import EnvoyProcess, validate
from services.mesh.errors import MeshConfigError
from services.mesh.files import write_bootstrap, write_endpoints, write_route
from services.mesh.istio import NOT_APPLICABLE_LOCALLY
from services.mesh.listeners import route_name
from services.mesh.loader import IstioConfig, load_istio
from services.mesh.routes import declared_weights, split_subsets
from services.mesh.topology import MeshEndpoint, MeshService, MeshTopology, host_key, unix_path

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
STATE_LOCK = "state.lock"
DEFAULT_WORKDIR = Path(".meshserve/mesh")


class LocalMesh:
    """The local stand-in for Istio: one Envoy whose configuration is rendered from `istio/`.

    The work folder holds `envoy.yaml`, `routes/*.yaml` (file-based RDS), `endpoints/*.yaml` (file-based EDS of the
    dynamic services' clusters), `envoy.log` and `state.json` (topology, istio paths, weight overrides), so another
    process can `attach()` and change weights or endpoints.
    """

    def __init__(
        self,
        topology: MeshTopology,
        istio_paths: Sequence[Path | str] = ("istio",),
        workdir: Path | str = DEFAULT_WORKDIR,
        *,
        weights: Mapping[str, Mapping[str, int]] | None = None,
        log_level: str = "warn",
        concurrency: int = 2,
    ) -> None:
        self.topology = topology
        self.istio_paths = [Path(p).resolve() for p in istio_paths]
        self.workdir = Path(workdir).resolve()
        self.overrides: dict[str, dict[str, int]] = {s: dict(w) for s, w in (weights or {}).items()}
        self.istio: IstioConfig = load_istio(self.istio_paths)
        self.envoy = EnvoyProcess(
            self.config_path, topology.admin, self.workdir / "envoy.log", log_level=log_level, concurrency=concurrency
        )

    # -- files -------------------------------------------------------------------------------------------

    @property
    def config_path(self) -> Path:
        return self.workdir / "envoy.yaml"

    @property
    def routes_dir(self) -> Path:
        return self.workdir / "routes"

    @property
    def endpoints_dir(self) -> Path:
        return self.workdir / "endpoints"

    def render(self) -> Path:
        """Write envoy.yaml, every route file, the endpoint files of dynamic services and state.json; the path of
        envoy.yaml."""
        rendered = render(self.istio, self.topology, self.routes_dir, self.overrides, self.endpoints_dir)
        write_bootstrap(self.config_path, rendered.bootstrap)
        for route in rendered.routes.values():
            write_route(self.routes_dir, route)
        for name, assignment in rendered.endpoints.items():
            write_endpoints(endpoints_file(self.endpoints_dir, name), assignment)
        self._update_state(lambda state: state.update(self._state()))
        return self.config_path

    def validate(self) -> None:
        """Render and run `envoy --mode validate` on the result (MeshConfigError if Envoy rejects it)."""
        validate(self.render())

    def _state(self) -> dict[str, object]:
        return {
            "topology": self.topology.model_dump(mode="json"),
            "istio_paths": [str(p) for p in self.istio_paths],
            "weights": self.overrides,
        }

    def _update_state(self, change: Callable[[dict[str, Any]], None]) -> None:
        """Apply `change` to state.json under a lock and replace the file atomically: processes that change weights
        and endpoints at the same time (the CLI, the autoscaler) keep each other's changes."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = self.workdir / STATE_FILE
        with (self.workdir / STATE_LOCK).open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state: dict[str, Any] = json.loads(path.read_text()) if path.exists() else self._state()
            change(state)
            tmp = path.with_name(f".{STATE_FILE}.{os.getpid()}")
            tmp.write_text(json.dumps(state, indent=2))
            os.replace(tmp, path)

    @classmethod
    def attach(cls, workdir: Path | str = DEFAULT_WORKDIR) -> LocalMesh:
        """The mesh a `start()` in another process (e.g. `meshserve up`) rendered into `workdir`."""
        path = Path(workdir) / STATE_FILE
        if not path.exists():
            raise MeshConfigError(f"{path}: no local mesh state (is the local mesh running?)")
        state = json.loads(path.read_text())
        return cls(
            MeshTopology.model_validate(state["topology"]), state["istio_paths"], workdir, weights=state["weights"]
        )

    # -- process -----------------------------------------------------------------------------------------

    @property
    def admin(self) -> EnvoyAdmin:
        return EnvoyAdmin(self.topology.admin)

    def start(self, timeout: float = 10.0) -> None:
        """Render, start Envoy (--disable-hot-restart, log in the work folder), return once /ready is LIVE."""
        self.render()
        addresses = [self.topology.admin, *(service.listen for service in self.topology.services.values())]
        for socket in filter(None, map(unix_path, addresses)):
            # Envoy binds its sockets but makes no folder for them; only their owner may enter one it makes
            socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        for field, why in NOT_APPLICABLE_LOCALLY.items():
            log.debug("istio field not applicable locally: %s (%s)", field, why)
        self.envoy.start()
        self.envoy.wait_ready(timeout)

    def stop(self) -> None:
        self.envoy.stop()

    def __enter__(self) -> LocalMesh:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- addresses ---------------------------------------------------------------------------------------

    @property
    def ingress_address(self) -> str | None:
        return self.topology.ingress

    @property
    def egress_address(self) -> str | None:
        """Where the edge tier's gateway reaches the cloud tier (MESHSERVE_GATEWAY_CLOUD_URL); None without egress."""
        return self.topology.egress.listen if self.topology.egress is not None else None

    def address(self, service: str) -> str:
        """Where callers reach `service` through the mesh (its outbound listener)."""
        return self._service(service).listen

    def _service(self, service: str) -> MeshService:
        try:
            return self.topology.services[service]
        except KeyError:
            raise MeshConfigError(
                f"unknown service '{service}' ({', '.join(sorted(self.topology.services))})"
            ) from None

    # -- canary weights ----------------------------------------------------------------------------------

    def subsets(self, service: str) -> list[str]:
        """The subsets a weighted route of `service` splits between (e.g. ['v1', 'v2'])."""
        self._service(service)
        return split_subsets(self.istio, service)

    def weights(self, service: str) -> dict[str, int]:
        """The split in force: the run-time override if any, else what `istio/` declares."""
        self._service(service)
        if service in self.overrides:
            return {s: self.overrides[service].get(s, 0) for s in self.subsets(service)}
        return declared_weights(self.istio, service)

    def set_weights(
        self, service: str, weights: Mapping[str, int], *, wait: bool = True, timeout: float = 5.0
    ) -> dict[str, int]:
        """Change the split of every weighted route of `service` without restarting Envoy; subsets left out get 0.

        The new route file is renamed into the watched folder; with `wait` this returns once Envoy serves it.
        """
        subsets = self.subsets(service)
        if not subsets:
            raise MeshConfigError(f"service '{service}' has no weighted route in {self.istio_paths}")
        unknown = sorted(set(weights) - set(subsets))
        if unknown:
            raise MeshConfigError(f"service '{service}': unknown subsets {unknown} (split between {subsets})")
        if any(w < 0 for w in weights.values()) or sum(weights.values()) != 100:
            raise MeshConfigError(f"service '{service}': weights must be >= 0 and sum to 100, got {dict(weights)}")
        self.overrides[service] = {s: int(weights.get(s, 0)) for s in subsets}
        name = route_name(service)
        route = render_routes(self.istio, self.topology, self.overrides)[name]
        version = write_route(self.routes_dir, route)
        self._update_state(lambda state: state["weights"].update({service: self.overrides[service]}))
        if wait:
            self.wait_route_version(name, version, timeout)
        return self.weights(service)

    def promote(self, service: str, canary: str = "v2", **kwargs: float | bool) -> dict[str, int]:
        """Send all split traffic to the canary subset."""
        return self.set_weights(service, {canary: 100}, **kwargs)  # type: ignore[arg-type]

    def rollback(self, service: str, stable: str = "v1", **kwargs: float | bool) -> dict[str, int]:
        """Send all split traffic back to the stable subset."""
        return self.set_weights(service, {stable: 100}, **kwargs)  # type: ignore[arg-type]

    def wait_route_version(self, name: str, version: str, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.admin.route_versions().get(name) == version:
                return
            time.sleep(0.02)
        raise TimeoutError(f"envoy did not load route '{name}' version {version} within {timeout}s")

    # -- endpoints of dynamic services -------------------------------------------------------------------

    def set_endpoints(
        self,
        service: str,
        replicas: Sequence[MeshEndpoint],
        *,
        wait: bool = True,
        timeout: float = 5.0,
        healthy: bool = False,
    ) -> None:
        """Replace the replicas of a dynamic service while Envoy runs, without dropping a request in flight.

        Every cluster of `service` (the whole service and each DestinationRule subset, with the replicas whose labels
        match it) gets a new endpoint file, renamed into the watched folder; state.json records the replicas. A host
        removed leaves the rotation at once (calls in flight to it finish); a host added is health-checked at once
        and is routable after its first passed check (a few ms for a serving replica; until then a cluster with no
        other healthy host answers "no healthy upstream").

        Args:
            service: a service of the topology with `dynamic: true` (MeshConfigError otherwise).
            replicas: all of its replicas from now on (an empty list takes it out of service).
            wait: return once Envoy's /clusters lists exactly these hosts in each of the service's clusters
                (TimeoutError naming a cluster that does not after `timeout` seconds).
            healthy: with `wait`, also wait until Envoy counts every one of these hosts healthy, i.e. routable.

        Example:
            mesh = LocalMesh.attach(".meshserve/mesh")
            mesh.set_endpoints("model", [MeshEndpoint(address="127.0.0.1:8101", labels={"version": "v1"})])
        """
        if not self._service(service).dynamic:
            raise MeshConfigError(f"service '{service}' is not dynamic: its endpoints are fixed in envoy.yaml")
        replicas = [MeshEndpoint.model_validate(r.model_dump()) for r in replicas]
        addresses = [r.address for r in replicas]
        if len(set(addresses)) != len(addresses):
            raise MeshConfigError(f"service '{service}': an address appears twice in {addresses}")
        members = cluster_members(self.istio, service, replicas)
        self.topology.services[service].replicas = replicas
        for name, hosts in members.items():
            write_endpoints(endpoints_file(self.endpoints_dir, name), load_assignment(name, hosts))
        dumped = [r.model_dump(mode="json") for r in replicas]
        self._update_state(lambda state: state["topology"]["services"][service].update(replicas=dumped))
        if wait:
            self.wait_hosts(
                {name: {host_key(r.address) for r in hosts} for name, hosts in members.items()}, timeout, healthy
            )

    def wait_hosts(self, expected: Mapping[str, set[str]], timeout: float = 5.0, healthy: bool = False) -> None:
        """Until Envoy's /clusters lists exactly `expected[cluster]` as the hosts of each cluster (and, with
        `healthy`, counts each of them healthy); TimeoutError naming the first cluster that is not so. Hosts are named
        as /clusters names them (services.mesh.topology.host_key: a Unix socket by its bare path)."""
        deadline = time.monotonic() + timeout
        while True:
            listed = self.admin.cluster_hosts()
            wrong = [name for name, hosts in expected.items() if not _as_expected(listed.get(name, {}), hosts, healthy)]
            if not wrong:
                return
            if time.monotonic() >= deadline:
                name = wrong[0]
                state = {a: f.get("health_flags", "?") for a, f in sorted(listed.get(name, {}).items())}
                raise TimeoutError(
                    f"envoy does not list {'healthy ' if healthy else ''}hosts {sorted(expected[name])} in cluster "
                    f"'{name}' after {timeout}s (it lists {state})"
                )
            time.sleep(0.01)


def _as_expected(listed: Mapping[str, Mapping[str, str]], hosts: set[str], healthy: bool) -> bool:
    if set(listed) != hosts:
        return False
    return not healthy or all(fields.get("health_flags") == "healthy" for fields in listed.values())
