"""EnvoyAdmin against an in-process stand-in of Envoy's admin interface."""

from __future__ import annotations

import json
import shutil
import socketserver
import tempfile
import threading
import urllib.error
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from services.mesh.admin import EnvoyAdmin
from tests.helpers.servers import free_port

STATS = (
    "cluster.outbound|grpc|v1|model.upstream_rq_retry: 3\n"
    "http.model.fault.aborts_injected: 12\n"
    "some.histogram: P0(nan,1)\n"
)
CLUSTERS = (
    "outbound|grpc|v1|model::default_priority::max_connections::100\n"
    "outbound|grpc|v1|model::127.0.0.1:8001::health_flags::healthy\n"
    "outbound|grpc|v1|model::127.0.0.1:8001::rq_total::5\n"
    "outbound|grpc|v1|model::127.0.0.1:8011::health_flags::/failed_outlier_check\n"
    "outbound|grpc|v2|model::127.0.0.1:8021::health_flags::healthy\n"
)
ROUTES = {"configs": [{"version_info": "42", "route_config": {"name": "outbound_model"}}]}


class FakeAdmin(BaseHTTPRequestHandler):
    paths: list[str] = []
    runtime: dict[str, str] = {}
    admin_layer = True  # Envoy answers 503 to /runtime_modify where its layered runtime has no admin layer

    def do_GET(self) -> None:
        FakeAdmin.paths.append(self.path)
        path = self.path.partition("?")[0]
        body = {"/ready": "LIVE\n", "/stats": STATS, "/clusters": CLUSTERS}.get(path)
        if path == "/config_dump":
            body = json.dumps(ROUTES)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write((body or "").encode())

    def do_POST(self) -> None:
        """/runtime_modify as Envoy's admin layer takes it: the query's keys and values (the body is not read)."""
        FakeAdmin.paths.append(self.path)
        path, _, query = self.path.partition("?")
        status, body = 404, b"invalid path\n"
        if path == "/runtime_modify" and not FakeAdmin.admin_layer:
            status, body = 503, b"No admin layer specified\n"
        elif path == "/runtime_modify":
            FakeAdmin.runtime.update(urllib.parse.parse_qsl(query, keep_blank_values=True))
            status, body = 200, b"OK\n"
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def admin() -> Iterator[EnvoyAdmin]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeAdmin)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield EnvoyAdmin(f"127.0.0.1:{server.server_address[1]}")
    server.shutdown()
    server.server_close()


def test_ready_stats_hosts_and_route_versions(admin: EnvoyAdmin) -> None:
    assert admin.ready()
    assert admin.stats() == {
        "cluster.outbound|grpc|v1|model.upstream_rq_retry": 3,
        "http.model.fault.aborts_injected": 12,
    }
    assert admin.stat("http.model.fault.aborts_injected") == 12
    assert FakeAdmin.paths[-1] == "/stats?filter=%5Ehttp%5C.model%5C.fault%5C.aborts_injected%24"  # escaped regex
    assert admin.hosts("outbound|grpc|v1|model") == {
        "127.0.0.1:8001": {"health_flags": "healthy", "rq_total": "5"},
        "127.0.0.1:8011": {"health_flags": "/failed_outlier_check"},
    }
    assert admin.route_versions() == {"outbound_model": "42"}


def test_runtime_values_are_posted_to_the_admin_layer(admin: EnvoyAdmin) -> None:
    FakeAdmin.runtime.clear()
    admin.set_runtime({"meshserve.ingress.adaptive_concurrency_enabled": "true", "a.b": "x y&z"})
    assert FakeAdmin.paths[-1] == "/runtime_modify?meshserve.ingress.adaptive_concurrency_enabled=true&a.b=x+y%26z"
    assert FakeAdmin.runtime == {"meshserve.ingress.adaptive_concurrency_enabled": "true", "a.b": "x y&z"}
    calls = len(FakeAdmin.paths)
    admin.set_runtime({})  # nothing to set: no call
    assert len(FakeAdmin.paths) == calls


def test_a_runtime_change_envoy_refuses_raises(admin: EnvoyAdmin) -> None:
    FakeAdmin.runtime.clear()
    FakeAdmin.admin_layer = False
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            admin.set_runtime({"a": "1"})
    finally:
        FakeAdmin.admin_layer = True
    assert refused.value.code == 503 and FakeAdmin.runtime == {}
    with pytest.raises(OSError):  # nobody answers
        EnvoyAdmin(f"127.0.0.1:{free_port()}", timeout=0.5).set_runtime({"a": "1"})


def test_an_admin_nobody_answers_is_not_ready() -> None:
    assert not EnvoyAdmin(f"127.0.0.1:{free_port()}", timeout=0.5).ready()


class UnixHTTPServer(socketserver.ThreadingUnixStreamServer):
    def get_request(self):  # BaseHTTPRequestHandler wants a (host, port) client address
        request, _ = super().get_request()
        return request, ("local", 0)


def test_admin_over_a_unix_socket() -> None:
    folder = Path(tempfile.mkdtemp(prefix="ms-", dir="/tmp"))
    path = folder / "admin.sock"
    server = UnixHTTPServer(str(path), FakeAdmin)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        admin = EnvoyAdmin(f"unix:{path}")
        assert admin.ready()
        assert admin.stat("http.model.fault.aborts_injected") == 12
        assert not EnvoyAdmin(f"unix:{folder / 'none.sock'}", timeout=0.5).ready()
        with pytest.raises(OSError):  # 404: an HTTPError, as for host:port
            admin.get("/nope")
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(folder, ignore_errors=True)
