"""The local stack's ports: a fixed layout from a port base, or free ports the OS offers, never one handed out twice."""

from __future__ import annotations

import random
import socket
from pathlib import Path

METRICS_OFFSET = 1000  # metrics port = gRPC port + 1000 (8000 -> 9000), as the default ports are laid out
LOWEST_FREE_PORT = 10000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()  # this process never hands out one port twice


def ephemeral_floor() -> int:
    """The lowest port the kernel hands out for bind(0) and outgoing connections (32768 where it does not say)."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, below the kernel's ephemeral range.

    A port the kernel offers for bind(0) and then sees released can be offered again at once, to the next
    process that binds port 0 or connects out (an embedded Valkey, a client socket): a port handed to a
    process that binds it later would then be taken. Ports below the ephemeral range are never offered that way,
    and this process never hands out the same one twice.
    """
    floor = ephemeral_floor()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(LOWEST_FREE_PORT, max(floor, LOWEST_FREE_PORT + 1000))
        if port not in _handed_out and not port_in_use(host, port):
            _handed_out.add(port)
            return port
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
