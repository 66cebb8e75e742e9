"""The listening TCP sockets of a set of processes, read from /proc as `ss -ltnp` does: the socket inodes each
process holds open (/proc/<pid>/fd -> socket:[inode]) matched against the kernel's tables of listening sockets
(/proc/<pid>/net/tcp and tcp6, state 0A)."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable
from pathlib import Path

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column
_SOCKET = re.compile(r"^socket:\[(\d+)\]$")


def socket_inodes(pid: int) -> set[int]:
    """The inodes of every socket `pid` holds open (empty when the process is gone or not ours to read)."""
    inodes: set[int] = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for name in names:
        try:
            match = _SOCKET.match(os.readlink(f"/proc/{pid}/fd/{name}"))
        except OSError:
            continue  # closed between the listing and the read
        if match:
            inodes.add(int(match.group(1)))
    return inodes


def _address(hex_address: str) -> tuple[str, int]:
    """`0100007F:1F90` (or the 32-digit IPv6 form) as ("127.0.0.1", 8080): /proc prints each 32-bit word of the
    address in host (little-endian) order."""
    host_hex, port_hex = hex_address.split(":")
    raw = bytes.fromhex(host_hex)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    host = ipaddress.ip_address(words)
    mapped = host.ipv4_mapped if isinstance(host, ipaddress.IPv6Address) else None  # grpc listens on tcp6
    return str(mapped or host), int(port_hex, 16)


def listening_table(pid: int) -> dict[int, tuple[str, int]]:
    """inode -> (host, port) of every listening TCP socket in `pid`'s network namespace."""
    table: dict[int, tuple[str, int]] = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == LISTEN:
                table[int(fields[9])] = _address(fields[1])
    return table


def walk_listening_sockets(pids: Iterable[int]) -> list[tuple[str, int]]:
    """(host, port) of every TCP socket one of `pids` listens on, sorted and without repeats (a port shared with
    SO_REUSEPORT, or one socket inherited by a child, appears once)."""
    found: set[tuple[str, int]] = set()
    for pid in pids:
        inodes = socket_inodes(pid)
        if not inodes:
            continue
        found.update(address for inode, address in listening_table(pid).items() if inode in inodes)
    return sorted(found, key=lambda a: (a[1], a[0]))
