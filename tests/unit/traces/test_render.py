"""The terminal renderables and the HTML report of `meshserve traces`, on synthetic pipeline traces with a slow
feature lookup: what a person reads names the slow stage, the trace and its spans; and both sides of a batched
call's links."""

from __future__ import annotations

import io
from html.parser import HTMLParser

from rich.console import Console

from services.traces import html_report, render
from services.traces.analysis import Breakdown, assemble, breakdown
from tests.unit.traces.synthetic import batched, pipeline


def slow_feature_breakdown() -> Breakdown:
    spans = []
    for i in range(40):
        spans += pipeline(i, online_ms=30.0 if i == 13 else 1.0)
    return breakdown(assemble(spans), slowest=2)


def text_of(*renderables: object) -> str:
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None)
    for r in renderables:
        console.print(r)
    return out.getvalue()


def test_units_and_bars() -> None:
    assert render.ms(1_234_567) == "1.23"
    assert len(render.clock(1_700_000_000_123_000_000)) == len("2023-11-14 22:13:20.123")
    assert render.bar(0, 50, 0, 100, width=10).plain == "█████     "
    assert render.bar(0, 0, 0, 100, width=10).plain.strip() != ""  # a zero-length span still shows


def test_stage_table_waterfall_and_critical_path_name_the_slow_stage() -> None:
    result = slow_feature_breakdown()
    slow_trace, steps = result.slowest[0]
    assert slow_trace.trace_id == f"{13:032x}"
    table = text_of(render.stage_table(result))
    assert "feature.online_lookup" in table and "model.forward" in table
    waterfall = text_of(render.waterfall(slow_trace))
    for stage in ("envoy.ingress", "gateway.features", "feature.online_lookup", "model.forward"):
        assert stage in waterfall
    assert "feature.online_lookup" in render.path_text(steps)
    paths = text_of(*render.critical_paths(result))
    assert slow_trace.trace_id in paths


def test_html_report_is_one_well_formed_page_about_the_hotspot() -> None:
    result = slow_feature_breakdown()
    page = html_report.report(result, title="hot <spots>")

    class Tags(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tags: list[str] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.tags.append(tag)

    parser = Tags()
    parser.feed(page)
    assert parser.tags.count("svg") == 2  # the stage chart and the slowest trace's waterfall
    assert "hot &lt;spots&gt;" in page and "<spots>" not in page  # the title is escaped
    assert "hotspot: feature.online_lookup" in page
    assert f"Slowest trace {13:032x}" in page
    assert page.count('class="path"') == 2


def test_links_of_a_batched_call_and_of_its_members() -> None:
    first, second = batched(members=2)
    batch = next(s for s in first if s.name == "features.batch")
    a_features, b_features = (next(s for s in t if s.name == "features") for t in (first, second))
    a, b = assemble(first + second)

    lines = [line.plain for line in render.link_lines(a, [batch])]
    assert lines == [
        f"    features {a_features.span_id}: batched with 1 other in {a.trace_id}/{batch.span_id} (features.batch)",
        f"      features.batch {batch.span_id}: links: 2 members: "
        f"{a.trace_id}/{a_features.span_id}, {b.trace_id}/{b_features.span_id}",
    ]
    assert [line.plain for line in render.link_lines(b, [batch])] == [
        f"    features {b_features.span_id}: batched with 1 other in {a.trace_id}/{batch.span_id} (features.batch)"
    ]
    assert render.link_lines(b) == []  # nothing links to it, it links to nothing
    marked = [row for row in text_of(render.waterfall(b, 200, [batch])).splitlines() if render.LINKED in row]
    assert len(marked) == 1 and "features" in marked[0]
    assert render.LINKED not in text_of(render.waterfall(b, 200))


def test_a_big_batch_names_a_few_members_and_counts_the_rest() -> None:
    traces = batched(members=8)
    batch = next(s for s in traces[0] if s.name == "features.batch")
    members = [next(s for s in t if s.name == "features") for t in traces]
    first = assemble(traces[0])[0]
    (line,) = [t.plain for t in render.link_lines(first) if "links:" in t.plain]
    shown = ", ".join(f"{m.trace_id}/{m.span_id}" for m in members[: render.LINKS_SHOWN])
    assert line.endswith(f"links: 8 members: {shown} and 4 more")
    last = assemble(traces[7])[0]
    (member_line,) = [t.plain for t in render.link_lines(last, [batch])]
    assert "batched with 7 others in" in member_line
