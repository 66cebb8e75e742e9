"""The trace UI over HTTP (the standard library's threading server): the pages, loaded from the `ui` package's
resources, and the JSON API (`services.traces.web_api`) over the store's SQLite file, each request on its own
connection. It asks for a token as Jupyter does: the URL printed at start carries `?token=...`, which sets a cookie
(and is then dropped from the address bar); a request with neither the cookie nor the token gets a 401 page saying
how to get in."""

from __future__ import annotations

import ipaddress
import json
import logging
import secrets
import threading
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from services.common.operator_check import bearer_credential, same_secret
from services.traces import web_api
from services.traces.store import TraceStore

log = logging.getLogger(__name__)
PAGES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}
# The pages load nothing from anywhere else, and no other site may frame them or read the API.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Resource-Policy": "same-origin",
}
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}
MAX_TRACE_ID = 32
MAX_PARAMS = 64
TOKEN_PARAM = "token"
LOCKED_PAGE = "locked.html"  # the 401 page: how to get in
COOKIE_DAYS = 30


def new_token() -> str:
    """A fresh UI token (what the UI asks for when it is given none)."""
    return secrets.token_urlsafe(24)


def with_token(url: str, token: str) -> str:
    """`url` that lets its opener in (sets the UI's cookie)."""
    return f"{url}?{urlencode({TOKEN_PARAM: token})}"


def page(name: str) -> bytes:
    """One of the UI's files, as shipped in the package."""
    return resources.files("services.traces.ui").joinpath(name).read_bytes()


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class TraceUI:
    """The UI's HTTP server on `host:port` (0: a free port) over the store file `db`; `start` serves from a daemon
    thread, `serve_forever` from the caller's.

    Bound to a loopback address it answers only requests whose Host names a loopback address, so that a page of
    another site cannot reach it by rebinding its own name to 127.0.0.1 (DNS rebinding). Every request needs
    `token` (None: a fresh random one), as `?token=`, the cookie that sets, or `Authorization: Bearer`; `login_url`
    is the address that lets its opener in."""

    def __init__(self, db: Path, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> None:
        self.db = db
        self.token = token or new_token()
        self.loopback_only = is_loopback(host)
        self.server = ThreadingHTTPServer((host, port), _Handler)
        self.server.daemon_threads = True
        self.server.ui = self  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        host = str(self.server.server_address[0])
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}/"

    @property
    def login_url(self) -> str:
        return with_token(self.url, self.token)

    @property
    def cookie_name(self) -> str:
        """Per port: a browser sends a host's cookies to all its ports, and two UIs have two tokens."""
        return f"meshserve-traces-{self.port}"

    def admitted(self, headers: Any, params: dict[str, str]) -> bool:
        """Whether a request with these headers and query parameters carries the token."""
        sent = [params.get(TOKEN_PARAM), bearer_credential([("authorization", headers.get("Authorization") or "")])]
        try:
            cookie = SimpleCookie(headers.get("Cookie") or "").get(self.cookie_name)
        except CookieError:
            cookie = None
        sent.append(cookie.value if cookie is not None else None)
        return any(value and same_secret(value, self.token) for value in sent)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.1,), name="traces-ui", daemon=True)
        self._thread.start()

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def stop(self) -> None:
        """Stop serving (waits for the loop, not for requests in flight) and close the socket."""
        if self._thread is not None:
            self.server.shutdown()
            self._thread.join(5)
        self.server.server_close()

    def host_allowed(self, host_header: str | None) -> bool:
        if not self.loopback_only:
            return True
        if not host_header:
            return False
        name = urlsplit(f"//{host_header}").hostname or ""
        return name.lower() in LOOPBACK_NAMES or is_loopback(name)

    def answer(self, path: str, params: dict[str, str]) -> tuple[int, Any]:
        """The API's answer to a GET of `path`: a status and a JSON-ready body."""
        if not self.db.exists():
            return HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"no trace store at {self.db} yet"}
        with TraceStore(self.db) as store:
            if path == "/api/traces":
                return HTTPStatus.OK, web_api.traces(store, params)
            if path == "/api/facets":
                return HTTPStatus.OK, web_api.facets(store)
            if path == "/api/hotspots":
                return HTTPStatus.OK, web_api.analysis(store, params)
            if path.startswith("/api/traces/"):
                trace_id = path.removeprefix("/api/traces/").lower()
                if not (0 < len(trace_id) <= MAX_TRACE_ID) or any(c not in "0123456789abcdef" for c in trace_id):
                    return HTTPStatus.BAD_REQUEST, {"error": "a trace id is up to 32 hex digits"}
                if len(trace_id) < MAX_TRACE_ID:  # a prefix: the one trace it names
                    matches = store.find_traces(trace_id)
                    if len(matches) != 1:
                        return HTTPStatus.NOT_FOUND, {"error": f"{trace_id} names {len(matches)} traces"}
                    trace_id = matches[0]
                found = web_api.trace(store, trace_id)
                if found is None:
                    return HTTPStatus.NOT_FOUND, {"error": f"no trace {trace_id}"}
                return HTTPStatus.OK, found
        return HTTPStatus.NOT_FOUND, {"error": f"no such API: {path}"}


class _Handler(BaseHTTPRequestHandler):
    server_version = "meshserve-traces"
    protocol_version = "HTTP/1.1"

    def do_HEAD(self) -> None:
        self._get(body=False)

    def do_GET(self) -> None:
        self._get(body=True)

    def _get(self, body: bool) -> None:
        ui: TraceUI = self.server.ui  # type: ignore[attr-defined]
        if not ui.host_allowed(self.headers.get("Host")):
            self._send(HTTPStatus.MISDIRECTED_REQUEST, b"this server answers loopback names only\n", "text/plain", body)
            return
        url = urlsplit(self.path)
        try:
            params: dict[str, str] | None = dict(
                parse_qsl(url.query, keep_blank_values=True, max_num_fields=MAX_PARAMS)
            )
        except ValueError:
            params = None
        if not ui.admitted(self.headers, params or {}):
            self._send(HTTPStatus.UNAUTHORIZED, page(LOCKED_PAGE), "text/html; charset=utf-8", body, cache="no-store")
            return
        if params and TOKEN_PARAM in params and not url.path.startswith("/api/"):
            self._let_in(ui, url.path)
            return
        if url.path in PAGES:
            name, content_type = PAGES[url.path]
            self._send(HTTPStatus.OK, page(name), content_type, body)
            return
        if not url.path.startswith("/api/"):
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain", body)
            return
        try:
            if params is None:
                raise web_api.BadRequest(f"more than {MAX_PARAMS} query parameters")
            params.pop(TOKEN_PARAM, None)
            status, answer = ui.answer(url.path, params)
        except web_api.BadRequest as exc:
            status, answer = HTTPStatus.BAD_REQUEST, {"error": str(exc)}
        except Exception:
            log.exception("GET %s failed", url.path)
            status, answer = HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal error (see the trace store's log)"}
        data = json.dumps(answer, separators=(",", ":"), default=str).encode()
        self._send(status, data, "application/json", body, cache="no-store")

    def _let_in(self, ui: TraceUI, path: str) -> None:
        """The login URL's answer: the cookie, and a redirect to the same page without the token in its address."""
        cookie = f"{ui.cookie_name}={ui.token}; Path=/; Max-Age={COOKIE_DAYS * 86400}; HttpOnly; SameSite=Strict"
        self.send_response(HTTPStatus.SEE_OTHER)
        self.send_header("Location", path or "/")
        self.send_header("Set-Cookie", cookie)
        self.send_header("Content-Length", "0")
        self.send_header("Cache-Control", "no-store")
        for name, value in SECURITY_HEADERS.items():
            self.send_header(name, value)
        self.end_headers()

    def _send(self, status: int, data: bytes, content_type: str, body: bool, cache: str = "no-cache") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", cache)
        for name, value in SECURITY_HEADERS.items():
            self.send_header(name, value)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)
