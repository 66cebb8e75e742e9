"""bench.chaos.report: the phase table, the Markdown and JSON files and the latest.json figures of a chaos run."""

from __future__ import annotations

import json
from pathlib import Path

from bench.chaos import report
from bench.chaos.outcomes import DEGRADED, REFUSED, WHOLE
from bench.chaos.phases import FAULT, Figures, Phase, Sample, assess_all


def steady(start: float, end: float, rate: float, kind: str = WHOLE, reason: str = "") -> list[Sample]:
    return [Sample(start + i / rate, 0.010, kind, reason, "1") for i in range(round((end - start) * rate))]


def a_run() -> report.Run:
    phases = [
        Phase("quiet", 0.5, 50, 0, 10),
        Phase("kill valkey", 0.5, 50, 10, 30, FAULT, 12.0, 12.0, ("features_",)),
        Phase("kill cache", 0.5, 50, 30, 50, FAULT, 32.0, 32.0),
    ]
    samples = steady(0, 12, 50) + steady(12, 14, 50, DEGRADED, "features_unavailable:default") + steady(14, 32, 50)
    samples += steady(32, 33, 50, REFUSED, "UNAVAILABLE") + steady(33, 50, 50)
    ramp = [report.RampStep(16.0, Figures(sent=80, whole=80, p50_s=0.01, p99_s=0.02), True)]
    run = report.Run("python -m bench.chaos", "2026-12-03", False, 100.0, " (test)", 0.08, ramp, [])
    run.phases = assess_all(phases, samples)
    run.faults = {"50%/kill valkey": "SIGKILL valkey (pid 5)"}
    run.generator_cpu = {"50%/quiet": 0.04}
    run.stack = {"gateway replicas": 2}
    run.generator = {"requests": len(samples)}
    return run


def test_phase_rows_show_counts_recovery_and_which_targets_were_missed() -> None:
    rows = {row[1]: row for row in report.phase_rows(a_run())}
    assert rows["quiet"][2:8] == [500, 500, 0, 0, 0, 0]
    assert rows["quiet"][10] == "-" and rows["quiet"][11] == "4%" and rows["quiet"][12] == 0.0
    assert rows["quiet"][13] == "met"
    valkey = rows["kill valkey"]
    assert valkey[4] == 100 and valkey[10] == 2.0 and valkey[13] == "met"
    assert rows["kill cache"][5] == 50 and rows["kill cache"][13] == "MISSED: 0 refused"


def test_cause_rows_name_each_cause_and_the_fault_injected() -> None:
    rows = {row[1]: row for row in report.cause_rows(a_run())}
    assert rows["kill valkey"][2:4] == ["SIGKILL valkey (pid 5)", "features_unavailable:default 100"]
    assert rows["kill cache"][4] == "UNAVAILABLE 50"
    assert report.reasons({"b": 1, "a": 1, "c": 3}) == "c 3, a 1, b 1"


def test_markdown_holds_the_tables_and_the_missed_targets() -> None:
    text = report.markdown(a_run())
    assert text.startswith("# Chaos run, 2026-12-03\n")
    assert "| level | phase | sent |" in text and "| 50% (50/s) | kill valkey | 1,000 |" in text
    assert "## Targets missed" in text and "| 50%/kill cache | 0 refused | 50 | FAIL |" in text
    assert "targets met 13/14" in text


def test_write_puts_md_and_json_under_the_date(tmp_path: Path) -> None:
    run = a_run()
    md, js = report.write(run, tmp_path, record=False)
    assert md.name == "chaos-2026-12-03.md" and js.name == "chaos-2026-12-03.json"
    data = json.loads(js.read_text())
    assert data["capacity_rps"] == 100.0
    valkey = data["phases"][1]
    assert valkey["degraded"] == {"features_unavailable:default": 100} and valkey["recovery_s"] == 2.0
    assert valkey["allowed_causes"] == ["features_"] and valkey["met"] is True
    assert len(valkey["per_second"]) == 20 and valkey["per_second"][2] == {
        "t_s": 2.0,
        "sent": 50,
        "whole": 0,
        "p99_ms": 10.0,
    }
    run.quick = True
    assert report.write(run, tmp_path, record=False)[0].name == "chaos-2026-12-03-quick.md"


def test_figures_name_each_phase_by_level() -> None:
    names = {f["name"]: f for f in report.figures(a_run())}
    assert names["chaos.capacity"]["value"] == 100.0
    assert names["chaos.l50.kill_valkey.degraded"]["value"] == 100
    assert names["chaos.l50.kill_valkey.recovery"]["value"] == 2.0
    assert "chaos.l50.quiet.recovery" not in names
    assert names["chaos.targets_met"]["value"] == 13 and names["chaos.targets_met"]["unit"] == "of 14"
