"""Writes the bootstrap, route and endpoint files; route and endpoint files are replaced atomically (write, then rename
into place)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import yaml

ROUTE_TYPE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
ENDPOINTS_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


def write_atomic(path: Path, text: str) -> None:
    """Write next to the watched folder, then rename in: Envoy never sees a half-written file."""
    staging = path.parent.parent / f".{path.parent.name}.staging"
    staging.mkdir(parents=True, exist_ok=True)
    tmp = staging / f"{path.name}.{os.getpid()}.{time.monotonic_ns()}"
    tmp.write_text(text)
    os.replace(tmp, path)


def write_route(routes_dir: Path, route: dict[str, Any], version: str | None = None) -> str:
    """A DiscoveryResponse holding one RouteConfiguration, as file-based RDS reads it; returns its version."""
    version = version or str(time.time_ns())
    doc = {"version_info": version, "resources": [{"@type": ROUTE_TYPE, **route}]}
    routes_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(routes_dir / f"{route['name']}.yaml", yaml.safe_dump(doc, sort_keys=False))
    return version


def write_endpoints(path: Path, assignment: dict[str, Any], version: str | None = None) -> str:
    """A DiscoveryResponse holding one ClusterLoadAssignment, as file-based EDS reads it; returns its version."""
    version = version or str(time.time_ns())
    doc = {"version_info": version, "resources": [{"@type": ENDPOINTS_TYPE, **assignment}]}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, yaml.safe_dump(doc, sort_keys=False))
    return version


def write_bootstrap(path: Path, bootstrap: dict[str, Any]) -> None:
    """envoy.yaml, readable by its owner only from the first byte on (it may hold the collector's credential)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(yaml.safe_dump(bootstrap, sort_keys=False))
