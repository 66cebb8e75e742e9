"""LocalMesh: renders `istio/` for a topology into a work folder, runs Envoy, and moves canary weights live."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from services.mesh.admin import EnvoyAdmin
from services.mesh.bootstrap import render, render_routes
from services.mesh.envoy import EnvoyProcess, validate
from services.mesh.errors import MeshConfigError
from services.mesh.files import write_bootstrap, write_route
from services.mesh.istio import NOT_APPLICABLE_LOCALLY
from services.mesh.listeners import route_name
from services.mesh.loader import IstioConfig, load_istio
from services.mesh.routes import declared_weights, split_subsets
from services.mesh.topology import MeshService, MeshTopology, unix_path

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
DEFAULT_WORKDIR = Path(".meshserve/mesh")


class LocalMesh:
    """The local stand-in for Istio: one Envoy whose configuration is rendered from `istio/`.

    The work folder holds `envoy.yaml`, `routes/*.yaml` (file-based RDS), `envoy.log` and `state.json`
    (topology, istio paths, weight overrides), so another process can `attach()` and change weights.
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

    def render(self) -> Path:
        """Write envoy.yaml, every route file and state.json; the path of envoy.yaml."""
        rendered = render(self.istio, self.topology, self.routes_dir, self.overrides)
        write_bootstrap(self.config_path, rendered.bootstrap)
        for route in rendered.routes.values():
            write_route(self.routes_dir, route)
        self._save_state()
        return self.config_path

    def validate(self) -> None:
        """Render and run `envoy --mode validate` on the result (MeshConfigError if Envoy rejects it)."""
        validate(self.render())

    def _save_state(self) -> None:
        state = {
            "topology": self.topology.model_dump(mode="json"),
            "istio_paths": [str(p) for p in self.istio_paths],
            "weights": self.overrides,
        }
        (self.workdir / STATE_FILE).write_text(json.dumps(state, indent=2))

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
        socket = unix_path(self.topology.admin)
        if socket is not None:  # Envoy binds the admin socket but makes no folder for it; only its owner may enter
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
        self._save_state()
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
