"""Retroactive collection: a short while after a trace is kept here, its spans are gathered from this process's
buffer and from every peer's (one request per peer for all the traces then due, plus the traces whose batched calls
they waited on), made whole or marked partial (assemble.py) and exported as one OTLP request. Triggers seen
by a process that is not the edge go to the peers (the edge among them keeps the trace). Head-sampled spans are
exported on a timer."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import socket
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.proto.trace.v1 import trace_pb2

from services.common.internal_auth import authorization, internal_token
from services.common.recording.assemble import Part, assemble
from services.common.recording.otlp import OtlpExporter, resource_spans
from services.common.recording.provider import Kept, Recorder
from services.common.recording.settings import RecordingSettings
from services.common.recording.spans import LINKED

log = logging.getLogger(__name__)
RESOLVE_EVERY_S = 5.0
MAX_ANSWER = 64 << 20


class Peer:
    """One kept-alive HTTP/1.1 connection to a process's admin endpoint, for JSON POSTs (one at a time), each with
    the internal credential `token` when there is one."""

    def __init__(self, host: str, port: int, token: str = "") -> None:
        self.host, self.port = host, port
        self._auth = f"Authorization: {authorization(token)}\r\n" if token else ""
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._lock = asyncio.Lock()

    async def post(self, path: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """The JSON answer (raises OSError, TimeoutError or ValueError); a connection that went stale is
        reopened once."""
        async with self._lock:
            try:
                return await asyncio.wait_for(self._exchange(path, body), timeout_s)
            except (OSError, asyncio.IncompleteReadError, ConnectionError):
                self.close()
            return await asyncio.wait_for(self._exchange(path, body), timeout_s)

    async def _exchange(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            if self._streams is None:
                self._streams = await asyncio.open_connection(self.host, self.port)
            reader, writer = self._streams
            data = json.dumps(body).encode()
            head = (
                f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n{self._auth}\r\n"
            )
            writer.write(head.encode() + data)
            await writer.drain()
            status = await reader.readline()
            length, close = None, False
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value.strip())
                elif name == "connection" and value.strip().lower() == "close":
                    close = True
            if length is None or length > MAX_ANSWER:
                raise ValueError(f"{path}: answer without a usable length ({length})")
            payload = await reader.readexactly(length)
        except BaseException:
            self.close()
            raise
        if close:
            self.close()
        parts = status.split()
        if len(parts) < 2 or parts[1] != b"200":
            raise ValueError(f"{path}: {status.decode('latin-1').strip()} {payload[:200]!r}")
        answer = json.loads(payload)
        if not isinstance(answer, dict):
            raise ValueError(f"{path}: not a JSON object")
        return answer

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


class Collector:
    """Collects the traces its Recorder keeps and exports them; exports the Recorder's head-sampled spans.

    Build and start it inside the event loop; `close()` collects what is still pending and flushes. Peers are asked
    with the internal credential `token` (by default this process's MESHSERVE_INTERNAL_TOKEN).
    """

    def __init__(
        self,
        recorder: Recorder,
        settings: RecordingSettings,
        exporter: OtlpExporter,
        instance_id: str,
        token: str | None = None,
    ):
        self.recorder = recorder
        self.token = internal_token() if token is None else token
        self.settings = settings
        self.exporter = exporter
        self.instance_id = instance_id
        self.delay_s = settings.collect_delay_ms / 1e3
        self.timeout_s = settings.collect_timeout_ms / 1e3
        self.interval_s = settings.collect_interval_ms / 1e3
        self._last = 0.0
        self._peer_links: dict[tuple[str, int], Peer] = {}
        self.pending: dict[int, Kept] = {}
        self.collected: dict[str, int] = {"complete": 0, "partial": 0}
        self.last_missing: list[str] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._resolved: tuple[float, list[tuple[str, int, str]]] = (0.0, [])
        self._flusher: asyncio.Task[None] | None = None
        recorder.on_keep = self.schedule
        recorder.on_trigger = self.announce

    def start(self) -> None:
        self._flusher = asyncio.get_running_loop().create_task(self._flush_sampled())

    # -- kept traces ---------------------------------------------------------------------------------------

    def schedule(self, kept: Kept) -> None:
        self.pending[kept.trace_id] = kept
        if self._timer is None:
            self._arm(kept.at)

    def _arm(self, first_at: float) -> None:
        """Collect when the oldest pending trace has waited `delay`, and at most once per `interval` (a collection
        costs every peer a request, however many traces it carries)."""
        due = max(first_at + self.delay_s, self._last + self.interval_s)
        self._timer = asyncio.get_running_loop().call_later(max(0.0, due - time.monotonic()), self._launch)

    def _launch(self) -> None:
        """Collect every pending trace that has waited `delay`."""
        self._timer = None
        now = self._last = time.monotonic()
        due = [k for k in self.pending.values() if k.at + self.delay_s <= now + 0.005]
        for kept in due:
            del self.pending[kept.trace_id]
        if due:
            self._spawn(self.collect(due))
        if self.pending:
            self._arm(next(iter(self.pending.values())).at)

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def collect(self, batch: Sequence[Kept]) -> dict[bytes, Any]:
        """Gather, assemble and export these kept traces (and the traces they waited on); the outcome of each."""
        wanted: dict[int, set[str]] = {k.trace_id: set(k.triggers) for k in batch if not k.sampled}
        for kept in batch:
            for leader in kept.leaders:
                wanted.setdefault(leader, {LINKED})
        ids = list(wanted)
        spans, lost = self.recorder.take(ids)
        own = Part(f"{self.recorder.service}@self", resource_spans(spans, self.recorder.resource, via=True))
        own.lost = {t.to_bytes(16, "big") for t in lost}
        peers = await self._peers()
        body = {"trace_ids": [f"{t:032x}" for t in ids], "collector": self.instance_id}
        answers = await asyncio.gather(*(self._ask(host, port, label, body) for host, port, label in peers))
        parts = [own, *(p for answer in answers if answer is not None for p in answer)]
        outcomes = assemble(parts, {t.to_bytes(16, "big"): names for t, names in wanted.items()})
        for trace_id, outcome in outcomes.items():
            if wanted[int.from_bytes(trace_id, "big")] == {LINKED} and not outcome.spans:
                continue
            self.collected["partial" if outcome.partial else "complete"] += 1
            if outcome.partial:
                self.last_missing = outcome.missing
        await self.exporter.export([p.resource for p in parts if p.resource is not None and p.resource.scope_spans])
        return outcomes

    async def _ask(self, host: str, port: int, label: str, body: dict[str, Any]) -> list[Part] | None:
        """One peer's parts (one per service it answers for); None for this process itself; an unanswered Part when
        it could not be asked."""
        try:
            answer = await self._peer(host, port).post("/recording/collect", body, self.timeout_s)
        except (OSError, TimeoutError, ValueError) as exc:
            log.debug("collection from %s failed: %s", label, exc)
            return [Part(label, None)]
        if answer.get("self"):
            return None
        encoded = answer.get("otlp") or ""
        resources = []
        try:  # one ResourceSpans, or a list of them (a peer answering for several services: Envoy's listeners)
            for text in encoded if isinstance(encoded, list) else [encoded]:
                resource = trace_pb2.ResourceSpans()
                resource.ParseFromString(base64.b64decode(text))
                resources.append(resource)
        except (binascii.Error, ValueError, TypeError) as exc:
            log.warning("collection from %s: unreadable answer (%s)", label, exc)
            return [Part(label, None)]
        service = str(answer.get("service") or "?")
        lost = {bytes.fromhex(t) for t in answer.get("lost", []) if isinstance(t, str) and len(t) == 32}
        parts = [Part(f"{service}@{label}", r, lost if i == 0 else set()) for i, r in enumerate(resources)]
        return parts or [Part(f"{service}@{label}", trace_pb2.ResourceSpans(), lost)]

    async def _peers(self) -> list[tuple[str, int, str]]:
        """(address, port, label) of every peer, names resolved to all their addresses (re-resolved every 5 s)."""
        at, resolved = self._resolved
        if time.monotonic() - at < RESOLVE_EVERY_S:
            return resolved
        loop = asyncio.get_running_loop()
        out: dict[tuple[str, int], str] = {}
        for peer in self.settings.all_peers():
            host, _, port_text = peer.rpartition(":")
            host = host.strip("[]")
            try:
                port = int(port_text)
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except (OSError, ValueError) as exc:
                log.warning("tracing peer %r does not resolve: %s", peer, exc)
                continue
            for info in infos:
                address = str(info[4][0])
                out.setdefault((address, port), f"{address}:{port}")
        resolved = [(a, p, label) for (a, p), label in out.items()]
        self._resolved = (time.monotonic(), resolved)
        return resolved

    def _peer(self, host: str, port: int) -> Peer:
        peer = self._peer_links.get((host, port))
        if peer is None:
            peer = self._peer_links[(host, port)] = Peer(host, port, self.token)
        return peer

    # -- triggers for the edge -----------------------------------------------------------------------------

    def announce(self, trace_id: int, name: str) -> None:
        """Tell every peer of a trigger seen here (the edge that served the request keeps the trace)."""
        self._spawn(self._announce(trace_id, name))

    async def _announce(self, trace_id: int, name: str) -> None:
        body = {"trace_id": f"{trace_id:032x}", "trigger": name}
        for host, port, label in await self._peers():
            try:
                await self._peer(host, port).post("/recording/trigger", body, self.timeout_s)
            except (OSError, TimeoutError, ValueError) as exc:
                log.debug("trigger to %s failed: %s", label, exc)

    # -- head-sampled spans --------------------------------------------------------------------------------

    async def _flush_sampled(self) -> None:
        every = self.settings.export_delay_ms / 1e3
        while True:
            await asyncio.sleep(every)
            await self.flush_sampled()

    async def flush_sampled(self) -> None:
        spans = self.recorder.drain_sampled()
        if spans:
            await self.exporter.export([resource_spans(spans, self.recorder.resource)])

    async def close(self) -> None:
        """Collect every pending trace now, export the sampled spans, stop."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._flusher is not None:
            self._flusher.cancel()
        if self.pending:
            batch, self.pending = list(self.pending.values()), {}
            self._spawn(self.collect(batch))
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.timeout_s + 2.0)
        await self.flush_sampled()
        for peer in self._peer_links.values():
            peer.close()
        await self.exporter.close()
