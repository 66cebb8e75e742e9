"""`meshserve traces` list / show / hotspots / ui through typer's CliRunner on a temporary store, batched calls
included, with the search filters the UI has."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from services.traces.analysis import assemble
from services.traces.cli import app, parse_duration
from services.traces.records import SpanRecord
from services.traces.store import TraceStore
from tests.unit.traces.synthetic import MS, batched, pipeline

runner = CliRunner()


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    path = tmp_path / "traces.sqlite"
    base = time.time_ns() - 120 * 10**9  # two minutes ago, one trace a second
    with TraceStore(path) as store:
        for i in range(40):
            store.insert(pipeline(i, online_ms=25.0 if i == 13 else 1.0, base_ns=base))
    return path


def test_list(db: Path) -> None:
    result = runner.invoke(app, ["list", "--db", str(db), "-n", "5"])
    assert result.exit_code == 0, result.output
    assert f"{39:032x}" in result.output and f"{34:032x}" not in result.output
    assert "envoy.ingress" in result.output and "OK" in result.output


def test_show_by_prefix(db: Path) -> None:
    trace_id = f"{13:032x}"
    result = runner.invoke(app, ["show", trace_id.upper(), "--db", str(db)])  # any case
    assert result.exit_code == 0, result.output
    out = result.output
    for stage in ("envoy.ingress", "gateway.rpc", "gateway.features", "feature.online_lookup", "model.forward"):
        assert stage in out
    assert "└ feature.online_lookup" in out
    assert "25.00" in out  # self and total time of the slow lookup
    assert "█" in out


def test_show_unknown_and_ambiguous(db: Path) -> None:
    assert runner.invoke(app, ["show", "ffff", "--db", str(db)]).exit_code == 1
    assert runner.invoke(app, ["show", "0000", "--db", str(db)]).exit_code == 2


def test_hotspots(db: Path, tmp_path: Path) -> None:
    page = tmp_path / "out" / "hot.html"
    result = runner.invoke(app, ["hotspots", "--db", str(db), "--last", "40", "--html", str(page)])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[-1].startswith("hotspot: feature.online_lookup (") and lines[-1].endswith("% of p99)")
    assert "self p99 ms" in result.output and "share of p99" in result.output
    assert "critical path of the slowest traces:" in result.output
    assert f"{13:032x} " in result.output
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and "<svg" in html and "<style>" in html
    assert "hotspot: feature.online_lookup (" in html
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")  # no external assets
    assert "<script" not in html and "<link" not in html


def test_hotspots_window(db: Path) -> None:
    # Traces started 120 s ago down to 81 s ago: none in the last 20 s; the slow one (13, 107 s ago) is not in 90 s.
    assert runner.invoke(app, ["hotspots", "--db", str(db), "--since", "20s"]).exit_code == 1
    result = runner.invoke(app, ["hotspots", "--db", str(db), "--since", "90s"])
    assert result.exit_code == 0, result.output
    assert "feature.online_lookup" not in result.output.strip().splitlines()[-1]
    last5 = runner.invoke(app, ["hotspots", "--db", str(db), "--last", "5", "--slowest", "0"])
    assert "5 traces" in last5.output and "critical path" not in last5.output


def test_missing_db(tmp_path: Path) -> None:
    result = runner.invoke(app, ["list", "--db", str(tmp_path / "nope.sqlite")])
    assert result.exit_code == 1
    assert not (tmp_path / "nope.sqlite").exists()


def test_parse_duration() -> None:
    assert parse_duration("5m") == 300
    assert parse_duration("250ms") == 0.25
    assert parse_duration("2") == 2
    assert parse_duration("1.5h") == 5400
    with pytest.raises(Exception, match="not a duration"):
        parse_duration("soon")


def test_html_is_well_formed(db: Path, tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET

    page = tmp_path / "hot.html"
    assert runner.invoke(app, ["hotspots", "--db", str(db), "--html", str(page)]).exit_code == 0
    html = page.read_text()
    svgs = [html[a : html.index("</svg>", a) + 6] for a in range(len(html)) if html.startswith("<svg", a)]
    assert len(svgs) == 2  # stage chart and the slowest trace's waterfall
    chart, waterfall = (ET.fromstring(svg) for svg in svgs)
    ns = "{http://www.w3.org/2000/svg}"
    assert len(chart.findall(f"{ns}rect")) == 13  # one bar per stage
    assert len(waterfall.findall(f"{ns}rect")) == 13  # one bar per span


@pytest.fixture()
def batch_db(tmp_path: Path) -> tuple[Path, list[list[SpanRecord]]]:
    """Two requests whose feature calls went as one batch (the second joined 0.2 ms later), and one on its own."""
    path = tmp_path / "batched.sqlite"
    traces = batched(members=2, online_ms=6.0, late_ms=0.2, base_ns=time.time_ns() - 60 * 10**9)
    with TraceStore(path) as store:
        for spans in traces:
            store.insert(spans)
        store.insert(pipeline(1, base_ns=time.time_ns() - 120 * 10**9))
    return path, traces


def test_show_renders_both_sides_of_a_batch(batch_db: tuple[Path, list[list[SpanRecord]]]) -> None:
    db, (first, second) = batch_db
    batch = next(s for s in first if s.name == "features.batch")
    b_features = next(s for s in second if s.name == "features")
    shown_first = runner.invoke(app, ["show", first[0].trace_id, "--db", str(db)])
    assert shown_first.exit_code == 0, shown_first.output
    assert "links:\n" in shown_first.output
    assert f"links: 2 members: {first[0].trace_id}/" in shown_first.output
    assert f"{second[0].trace_id}/{b_features.span_id}" in shown_first.output
    assert f"batched with 1 other in {first[0].trace_id}/{batch.span_id} (features.batch)" in shown_first.output
    shown_second = runner.invoke(app, ["show", second[0].trace_id, "--db", str(db)])
    assert shown_second.exit_code == 0, shown_second.output
    assert f"features {b_features.span_id}: batched with 1 other in {first[0].trace_id}/{batch.span_id}" in (
        shown_second.output
    )
    assert "links: 2 members" not in shown_second.output  # the batch span is not in this trace
    plain = runner.invoke(app, ["show", f"{1:032x}", "--db", str(db)])
    assert plain.exit_code == 0 and "links:" not in plain.output and "batched" not in plain.output


def test_hotspots_of_a_member_count_the_batched_call_it_waited_for(
    batch_db: tuple[Path, list[list[SpanRecord]]],
) -> None:
    db, (first, second) = batch_db
    # Only the second member's trace is in the window; the batched call it waited for is in the first one's.
    result = runner.invoke(app, ["hotspots", "--db", str(db), "--last", "1", "--slowest", "0"])
    assert result.exit_code == 0, result.output
    assert "1 traces" in result.output
    trace = assemble(first + second)[1]
    share = trace.stage_self_ns()["feature.online_lookup"] / trace.duration_ns
    assert trace.stage_self_ns()["feature.online_lookup"] == 6 * MS
    assert result.output.strip().splitlines()[-1] == f"hotspot: feature.online_lookup ({round(share * 100)}% of p99)"
    for stage in ("envoy.feature.upstream", "feature.rpc", "gateway.features.batch"):
        assert stage in result.output


def test_list_filters_like_the_ui(db: Path) -> None:
    slow = runner.invoke(app, ["list", "--db", str(db), "--min-ms", "20"])
    assert slow.exit_code == 0, slow.output
    assert f"{13:032x}" in slow.output and f"{12:032x}" not in slow.output
    slowest = runner.invoke(app, ["list", "--db", str(db), "--slowest", "-n", "1"])
    assert f"{13:032x}" in slowest.output
    none = runner.invoke(app, ["list", "--db", str(db), "--status", "error"])
    assert none.exit_code == 0 and "match" in none.output
    assert runner.invoke(app, ["list", "--db", str(db), "--status", "bad"]).exit_code == 2


def test_hotspots_of_the_slow_traces_alone(db: Path) -> None:
    result = runner.invoke(app, ["hotspots", "--db", str(db), "--min-ms", "20"])
    assert result.exit_code == 0, result.output
    assert "1 traces" in result.output
    assert result.output.strip().splitlines()[-1].startswith("hotspot: feature.online_lookup (")


def test_ui_serves_until_interrupted(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from services.traces import web

    served: list[str] = []

    def serve_forever(self: web.TraceUI) -> None:
        served.append(self.url)
        raise KeyboardInterrupt

    monkeypatch.setattr(web.TraceUI, "serve_forever", serve_forever)
    result = runner.invoke(app, ["ui", "--db", str(db), "--port", "0"])
    assert result.exit_code == 0, result.output
    assert served and served[0].startswith("http://127.0.0.1:")
    assert f"trace UI at {served[0]}" in result.output
    assert runner.invoke(app, ["ui", "--db", str(db.parent / "none.sqlite")]).exit_code == 1


def test_hotspots_since_reads_every_trace_in_the_window_and_says_how_many(tmp_path: Path) -> None:
    path = tmp_path / "many.sqlite"
    base = time.time_ns() - 200 * 10**9
    with TraceStore(path) as store:
        for i in range(130):  # more than a search without a window reads
            store.insert(pipeline(i, base_ns=base))
    window = runner.invoke(app, ["hotspots", "--db", str(path), "--since", "10m", "--slowest", "0"])
    assert window.exit_code == 0, window.output
    assert "130 traces" in window.output and "considered all 130 matching traces" in window.output
    latest = runner.invoke(app, ["hotspots", "--db", str(path), "--slowest", "0"])
    assert "considered the latest 100 of 130 matching traces (--last 130 reads more)" in latest.output
    five = runner.invoke(app, ["hotspots", "--db", str(path), "--since", "10m", "--last", "5", "--slowest", "0"])
    assert "considered the latest 5 of 130 matching traces" in five.output


def test_ui_on_a_port_in_use_says_so_and_points_to_the_stacks_own_ui(db: Path) -> None:
    import json
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        url = f"http://127.0.0.1:{port}/"
        (db.parent / "stack.json").write_text(json.dumps({"traces_ui": url}))  # the stack whose store this is
        result = runner.invoke(app, ["ui", "--db", str(db), "--port", str(port)])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)  # no OSError, no traceback
    assert f"port {port} on 127.0.0.1 is in use" in result.output
    assert f"already serves this UI at {url}" in result.output
    assert "--port N" in result.output


def test_ui_opens_the_running_stacks_ui_with_its_token(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from services.cli.stack.credentials import StackSecrets
    from services.traces import web

    secrets = StackSecrets.ensure(db.parent)
    token = secrets.renew_ui_token()
    url = "http://127.0.0.1:18091/"
    (db.parent / "stack.json").write_text(json.dumps({"traces_ui": url, "secrets_dir": str(secrets.dir)}))

    def serve_forever(self: web.TraceUI) -> None:
        raise RuntimeError("served a UI of its own")

    monkeypatch.setattr(web.TraceUI, "serve_forever", serve_forever)
    result = runner.invoke(app, ["ui", "--db", str(db), "--no-browser"])
    assert result.exit_code == 0, result.output
    assert f"{url}?token={token}" in result.output
    own = runner.invoke(app, ["ui", "--db", str(db), "--serve", "--port", "0", "--no-browser"])  # --serve: its own
    assert own.exit_code == 1 and "served a UI of its own" in str(own.exception)
