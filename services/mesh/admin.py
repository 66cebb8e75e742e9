"""A small client of Envoy's admin interface: readiness, stats, cluster host health, route versions."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


class EnvoyAdmin:
    """Envoy's admin API on `address` (host:port)."""

    def __init__(self, address: str, timeout: float = 2.0) -> None:
        self.address = address
        self.timeout = timeout

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"http://{self.address}{path}", timeout=self.timeout) as response:
            return response.read().decode()

    def ready(self) -> bool:
        try:
            return self.get("/ready").strip() == "LIVE"
        except (OSError, urllib.error.URLError):
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
        out: dict[str, dict[str, str]] = {}
        prefix = f"{cluster}::"
        for line in self.get("/clusters").splitlines():
            if not line.startswith(prefix):
                continue
            parts = line[len(prefix) :].split("::")
            if len(parts) == 3 and parts[0][0].isdigit():
                out.setdefault(parts[0], {})[parts[1]] = parts[2]
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
