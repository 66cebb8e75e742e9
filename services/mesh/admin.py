"""A small client of Envoy's admin interface (host:port or a Unix socket): readiness, stats, hosts, route versions,
runtime values."""

from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from services.mesh.topology import split_address, unix_path


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a Unix socket (Envoy's admin on a `pipe`)."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self.socket_path))
        except OSError:
            sock.close()
            raise
        self.sock = sock


class EnvoyAdmin:
    """Envoy's admin API on `address`: host:port, or unix:/abs/path."""

    def __init__(self, address: str, timeout: float = 2.0) -> None:
        self.address = address
        self.timeout = timeout

    def _connection(self) -> http.client.HTTPConnection:
        path = unix_path(self.address)
        if path is not None:
            return _UnixHTTPConnection(path, self.timeout)
        host, port = split_address(self.address)
        return http.client.HTTPConnection(host, port, timeout=self.timeout)

    def get(self, path: str) -> str:
        """The body of GET `path`; urllib.error.HTTPError (an OSError) unless Envoy answers 200."""
        return self._request("GET", path)

    def _request(self, method: str, path: str) -> str:
        connection = self._connection()
        try:
            connection.request(method, path)
            response = connection.getresponse()
            body = response.read().decode()
        except http.client.HTTPException as exc:
            raise OSError(f"envoy admin {self.address}{path}: {exc!r}") from exc
        finally:
            connection.close()
        if response.status != 200:
            raise urllib.error.HTTPError(f"{self.address}{path}", response.status, body[:200], response.headers, None)
        return body

    def set_runtime(self, values: Mapping[str, str]) -> None:
        """Sets runtime keys in Envoy's admin layer (POST /runtime_modify), live: e.g. a RuntimeFeatureFlag's key to
        "true" or "false". urllib.error.HTTPError (an OSError) unless Envoy answers 200, as where its bootstrap's
        layered runtime has no admin layer."""
        if values:
            self._request("POST", f"/runtime_modify?{urllib.parse.urlencode(dict(values))}")

    def ready(self) -> bool:
        try:
            return self.get("/ready").strip() == "LIVE"
        except OSError:
            return False

    def stats(self, filter_regex: str = "") -> dict[str, int]:
        """Counters and gauges (name -> value), optionally only those matching a regex."""
        query = f"?filter={urllib.parse.quote(filter_regex)}" if filter_regex else ""
        out: dict[str, int] = {}
        for line in self.get(f"/stats{query}").splitlines():
            name, sep, value = line.rpartition(": ")
            if sep and value.strip().lstrip("-").isdigit():
                out[name] = int(value)
        return out

    def stat(self, name: str) -> int:
        return self.stats(f"^{_escape(name)}$").get(name, 0)

    def hosts(self, cluster: str) -> dict[str, dict[str, str]]:
        """Per host address of a cluster, its /clusters fields (e.g. health_flags, rq_total)."""
        return self.cluster_hosts().get(cluster, {})

    def cluster_hosts(self) -> dict[str, dict[str, dict[str, str]]]:
        """Per cluster with at least one host, per host address, its /clusters fields (one admin call). A host is
        `ip:port`, or the bare path of a Unix socket (services.mesh.topology.host_key)."""
        out: dict[str, dict[str, dict[str, str]]] = {}
        for line in self.get("/clusters").splitlines():
            parts = line.split("::")
            if len(parts) == 4 and (parts[1][:1].isdigit() or parts[1].startswith("/")):
                cluster, host, key, value = parts
                out.setdefault(cluster, {}).setdefault(host, {})[key] = value
        return out

    def route_versions(self) -> dict[str, str]:
        """Route configuration name -> version_info Envoy is serving (file-based RDS)."""
        dump: dict[str, Any] = json.loads(self.get("/config_dump?resource=dynamic_route_configs"))
        out: dict[str, str] = {}
        for config in dump.get("configs", []):
            route = config.get("route_config", {})
            out[route.get("name", "")] = config.get("version_info", "")
        return out


def _escape(name: str) -> str:
    return "".join("\\" + c if c in ".|[]()*+?^$\\{}" else c for c in name)
