"""The trace UI's HTTP server on a real loopback socket: the pages from package resources (nothing loaded from
elsewhere), the JSON API with its errors, and requests under another site's name (DNS rebinding) refused."""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest

from services.traces.store import TraceStore
from services.traces.web import PAGES, TraceUI
from tests.unit.traces.synthetic import pipeline

NOW = 1_800_000_000_000_000_000


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TraceUI]:
    db = tmp_path_factory.mktemp("ui") / "t.sqlite"
    with TraceStore(db) as store:
        for i in range(5):
            store.insert(pipeline(i, online_ms=30.0 if i == 3 else 1.0), NOW)
    server = TraceUI(db, "127.0.0.1", 0)
    server.start()
    yield server
    server.stop()


def get(
    ui: TraceUI, path: str, host: str | None = None, method: str = "GET", token: str | None = ""
) -> http.client.HTTPResponse:
    """`path` with the UI's token (in its cookie), another `token`, or none (None)."""
    connection = http.client.HTTPConnection("127.0.0.1", ui.port, timeout=10)
    headers = {"Host": host} if host is not None else {}
    if token is not None:
        headers["Cookie"] = f"{ui.cookie_name}={token or ui.token}"
    connection.request(method, path, headers=headers)
    return connection.getresponse()


def test_pages_are_package_resources_with_a_strict_policy(ui: TraceUI) -> None:
    assert ui.url == f"http://127.0.0.1:{ui.port}/"
    for path, (name, content_type) in PAGES.items():
        answer = get(ui, path)
        assert answer.status == 200 and answer.headers["Content-Type"] == content_type
        assert answer.read() == resources.files("services.traces.ui").joinpath(name).read_bytes()
        policy = answer.headers["Content-Security-Policy"]
        assert "default-src 'none'" in policy and "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
    assert get(ui, "/../settings.py").status == 404
    assert get(ui, "/__init__.py").status == 404
    head = get(ui, "/", method="HEAD")
    assert head.status == 200 and head.read() == b"" and int(head.headers["Content-Length"]) > 0
    assert get(ui, "/", method="POST").status == 501


def test_the_pages_load_nothing_from_elsewhere() -> None:
    for name in ("index.html", "app.js", "style.css"):
        text = resources.files("services.traces.ui").joinpath(name).read_text()
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.I), name  # no CDN, no web fonts
        assert "@import" not in text and "innerHTML" not in text and "eval(" not in text, name
    html = resources.files("services.traces.ui").joinpath("index.html").read_text()
    assert re.findall(r'(?:src|href)="([^"#]+)"', html) == ["data:,", "style.css", "app.js"]  # an empty icon


def test_the_api(ui: TraceUI) -> None:
    answer = get(ui, "/api/traces?min_ms=30&order=slowest")
    assert answer.status == 200 and answer.headers["Content-Type"] == "application/json"
    assert answer.headers["Cache-Control"] == "no-store"
    listed = json.loads(answer.read())
    assert [t["trace_id"] for t in listed["traces"]] == [f"{3:032x}"]
    one = json.loads(get(ui, f"/api/traces/{3:032X}").read())  # any case
    assert one["stages"][0]["stage"] == "feature.online_lookup"
    assert json.loads(get(ui, "/api/hotspots").read())["hotspot"]["stage"] == "feature.online_lookup"
    assert json.loads(get(ui, "/api/facets").read())["traces"] == 5


@pytest.mark.parametrize(
    ("path", "status", "words"),
    [
        ("/api/traces?status=maybe", 400, "status"),
        ("/api/traces?limit=100000", 400, "limit"),
        ("/api/traces/xyz", 400, "hex"),
        ("/api/traces/" + "a" * 33, 400, "hex"),
        ("/api/traces/" + "f" * 32, 404, "no trace"),
        ("/api/traces/0000", 404, "names 5 traces"),
        ("/api/nope", 404, "no such API"),
        ("/api/traces?" + "&".join(f"p{i}=1" for i in range(100)), 400, "query parameters"),
    ],
)
def test_api_errors(ui: TraceUI, path: str, status: int, words: str) -> None:
    answer = get(ui, path)
    assert answer.status == status
    assert words in json.loads(answer.read())["error"]


def test_a_missing_store_is_unavailable_not_created(tmp_path: Path) -> None:
    server = TraceUI(tmp_path / "none.sqlite", "127.0.0.1", 0)
    server.start()
    try:
        answer = get(server, "/api/traces")
        assert answer.status == 503 and "no trace store" in json.loads(answer.read())["error"]
        assert get(server, "/").status == 200
    finally:
        server.stop()
    assert not (tmp_path / "none.sqlite").exists()


@pytest.mark.parametrize("host", ["evil.example", "evil.example:80", "127.0.0.1.nip.io", ""])
def test_other_host_names_are_refused(ui: TraceUI, host: str) -> None:
    answer = get(ui, "/api/traces", host=host)
    assert answer.status == 421
    assert b"trace_id" not in answer.read()


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1:1234", "[::1]:8091", "LOCALHOST:80"])
def test_loopback_host_names_are_served(ui: TraceUI, host: str) -> None:
    assert get(ui, "/api/facets", host=host).status == 200


def test_without_its_token_the_ui_says_how_to_get_in(ui: TraceUI) -> None:
    for path in ("/", "/app.js", "/api/traces", "/api/traces/ab"):
        for token in (None, "not-the-token"):
            answer = get(ui, path, token=token)
            text = answer.read().decode()
            assert answer.status == 401, (path, token)
            assert "?token=" in text and "meshserve traces ui" in text and "trace_id" not in text
    assert ui.login_url == f"{ui.url}?token={ui.token}"


def test_the_login_url_sets_the_cookie_and_drops_the_token_from_the_address(ui: TraceUI) -> None:
    answer = get(ui, f"/?token={ui.token}", token=None)
    assert answer.status == 303 and answer.headers["Location"] == "/"
    cookie = answer.headers["Set-Cookie"]
    assert cookie.startswith(f"{ui.cookie_name}={ui.token};") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert get(ui, f"/?token=wrong{ui.token}", token=None).status == 401
    # the cookie lets the pages and the API in; API clients may send the token as a bearer token instead
    assert get(ui, "/api/facets").status == 200
    connection = http.client.HTTPConnection("127.0.0.1", ui.port, timeout=10)
    connection.request("GET", "/api/facets", headers={"Authorization": f"Bearer {ui.token}"})
    assert connection.getresponse().status == 200


def test_two_uis_have_two_tokens(tmp_path: Path) -> None:
    one, two = TraceUI(tmp_path / "a.sqlite", "127.0.0.1", 0), TraceUI(tmp_path / "b.sqlite", "127.0.0.1", 0, "set")
    try:
        assert one.token != two.token and two.token == "set" and len(one.token) >= 32
        assert one.cookie_name != two.cookie_name
    finally:
        one.stop()
        two.stop()
