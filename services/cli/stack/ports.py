"""The local stack's ports: a fixed layout from a port base, or free ports the OS offers, never one handed out twice."""

from __future__ import annotations

import socket

METRICS_OFFSET = 1000  # metrics port = gRPC port + 1000 (8000 -> 9000), as the default ports are laid out


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
        return False


class PortAllocator:
    """Hands out the stack's ports: `base + offset` and its metrics port (+1000), or with base 0 free ports.

    Example:
        ports = PortAllocator(8000)
        ports.pair(2)  # (8002, 9002): the feature service and its /metrics
        ports.one(80)  # 8080: Envoy's ingress
        PortAllocator(0).pair(2)  # two free ports the OS offered
    """

    def __init__(self, base: int, host: str = "127.0.0.1") -> None:
        self.base = base
        self.host = host
        self.taken: set[int] = set()

    @property
    def free(self) -> bool:
        """Every port a free one (base 0)."""
        return self.base == 0

    def fresh(self) -> int:
        """A free port not handed out before (the OS may offer a just-released port again)."""
        while (p := free_port(self.host)) in self.taken:
            pass
        self.taken.add(p)
        return p

    def pair(self, offset: int) -> tuple[int, int]:
        """A gRPC port and its metrics port."""
        if self.free:
            return self.fresh(), self.fresh()
        return self.base + offset, self.base + offset + METRICS_OFFSET

    def one(self, offset: int) -> int:
        """A port without a metrics port (Valkey, Envoy's listeners, the trace store's)."""
        return self.fresh() if self.free else self.base + offset
