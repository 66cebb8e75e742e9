"""A recording process's admin HTTP endpoint (on its metrics port): `/metrics`, and its buffer for collectors.

* `POST /recording/collect` `{"trace_ids": [hex, ...], "collector": id}`: this process's spans of those traces,
  removed from its buffer, as OTLP `ResourceSpans` (base64 of the protobuf) with its resource, and the ids of the
  traces it lost spans of (its buffer rolled over): `{"service", "spans", "lost": [hex], "otlp"}`. A request from
  this process's own collector is answered `{"self": true}` (it reads its buffer directly).
* `POST /recording/trigger` `{"trace_id": hex, "trigger": name}`: another process saw a symptom (the model service:
  a long queue wait); an edge keeps the trace when its request ends here (`{"seen": bool}`).

Every request needs the stack's internal credential when this process has one (services.common.internal_auth).
Requests are served on threads; the buffer is touched only on the event loop (the answer is encoded here, off it).
A client gone before its answer is written (a collector that timed out or restarted) is one warning line.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import logging
import re
import threading
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any, TypeVar

from prometheus_client.exposition import MetricsHandler

from services.common.internal_auth import http_admitted, internal_token
from services.common.recording.otlp import resource_spans
from services.common.recording.provider import Recorder

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_BODY = 1 << 20
MAX_IDS = 20_000
ON_LOOP_TIMEOUT_S = 5.0
_HEX32 = re.compile(r"^[0-9a-f]{32}$")


class JsonAdmin:
    """An admin HTTP endpoint: `/metrics` (GET) and JSON POST routes (`routes()`: path -> handler of the body),
    served on threads; start() binds (port 0 picks one).

    With the internal credential (`token`, by default this process's MESHSERVE_INTERNAL_TOKEN) every request
    without `Authorization: Bearer <token>` gets 401 and is not read further; without one the endpoint is open."""

    def __init__(self, host: str, port: int, token: str | None = None) -> None:
        admin = self
        self.token = internal_token() if token is None else token

        class Handler(MetricsHandler):
            protocol_version = "HTTP/1.1"  # collectors keep their connection (and its thread) across requests

            def do_GET(self) -> None:
                self.close_connection = True  # /metrics answers without a length: its end is the connection's
                if http_admitted(self, admin.token):
                    super().do_GET()

            def do_POST(self) -> None:
                if http_admitted(self, admin.token):
                    admin.handle_post(self)

            def handle_one_request(self) -> None:
                self.command, self.path = "", ""  # not yet read: a kept connection's last request is not this one
                super().handle_one_request()

            def handle(self) -> None:
                try:
                    super().handle()
                except ConnectionError as exc:  # a collector or scraper gone (timed out, restarted)
                    doing = f"{self.command} {self.path}" if self.path else "a request"
                    log.warning("admin endpoint: %s:%s went away during %s (%s)", *self.client_address[:2], doing, exc)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, name="admin-http", daemon=True)

    def routes(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        return {}

    def start(self) -> int:
        self._thread.start()
        return self.port

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def handle_post(self, handler: MetricsHandler) -> None:
        try:
            length = int(handler.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                raise ValueError("body too large")
            body = json.loads(handler.rfile.read(length) or b"{}")
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
            route = self.routes().get(handler.path)
            if route is None:
                self._reply(handler, 404, {"error": "not found"})
                return
            answer = route(body)
        except (ValueError, TypeError) as exc:
            self._reply(handler, 400, {"error": str(exc)[:200]})
            return
        except Exception as exc:
            log.exception("admin request %s failed", handler.path)
            self._reply(handler, 500, {"error": repr(exc)[:200]})
            return
        self._reply(handler, 200, answer)

    @staticmethod
    def _reply(handler: MetricsHandler, status: int, answer: dict[str, Any]) -> None:
        data = json.dumps(answer).encode()
        if status != 200:
            handler.close_connection = True  # the body may not have been read: the stream is not trusted after it
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)


class AdminServer(JsonAdmin):
    """The admin endpoint of one recording process: its buffer for collectors, and other processes' triggers."""

    def __init__(self, recorder: Recorder, instance_id: str, host: str, port: int, token: str | None = None) -> None:
        self.recorder = recorder
        self.instance_id = instance_id
        self.loop = asyncio.get_running_loop()
        super().__init__(host, port, token)

    def routes(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        return {"/recording/collect": self.collect, "/recording/trigger": self.trigger}

    def on_loop(self, call: Callable[[], T]) -> T:
        """Run `call` on the event loop (the buffer's only thread) and wait for it."""
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(call())
            except BaseException as exc:  # handed to the waiting thread
                done.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return done.result(ON_LOOP_TIMEOUT_S)

    def collect(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("collector") == self.instance_id:
            return {"self": True}
        ids = [trace_id_of(t) for t in body.get("trace_ids", [])[:MAX_IDS]]
        spans, lost = self.on_loop(lambda: self.recorder.take(ids))
        otlp = resource_spans(spans, self.recorder.resource, via=True).SerializeToString() if spans else b""
        return {
            "service": self.recorder.service,
            "spans": len(spans),
            "lost": [f"{t:032x}" for t in lost],
            "otlp": base64.b64encode(otlp).decode(),
        }

    def trigger(self, body: dict[str, Any]) -> dict[str, Any]:
        trace_id = trace_id_of(body.get("trace_id"))
        name = str(body.get("trigger") or "")[:64]
        if not name:
            raise ValueError("no trigger")
        return {"seen": self.on_loop(lambda: self.recorder.external_trigger(trace_id, name))}


def trace_id_of(value: Any) -> int:
    if not isinstance(value, str) or not _HEX32.match(value):
        raise ValueError(f"not a trace id (32 lowercase hex digits): {str(value)[:40]!r}")
    return int(value, 16)
