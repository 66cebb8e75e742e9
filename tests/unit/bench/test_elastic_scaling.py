"""bench.lib.scaling: the autoscaler's decisions as a replica count over time, replica-seconds over a span, the
per-second timeline, cold starts read from the model replicas' logs, and a load step's reaction time."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from bench.lib.scaling import (
    ColdStart,
    Decision,
    count_at,
    parse_cold_starts,
    parse_decisions,
    per_second,
    reaction_s,
    read_cold_starts,
    read_decisions,
    replica_seconds,
    timeline_text,
)

# 0 until 10 s, 1 until 20 s, 3 until 30 s, 0 after
TIMELINE = [Decision(10.0, "v1", 0, 1), Decision(20.0, "v1", 1, 3), Decision(30.0, "v1", 3, 0)]


def test_decisions_are_read_from_a_list_or_an_object_and_sorted_by_time() -> None:
    records = [
        {"time": 20.5, "subset": "v1", "from": 1, "to": 2, "reason": "demand 20 > 16"},
        {"time": 3.0, "subset": "v1", "from": 0, "to": 1, "reason": "parked"},
        {"subset": "v1", "from": 2, "to": 1},  # no time: skipped
    ]
    expected = [Decision(3.0, "v1", 0, 1, "parked"), Decision(20.5, "v1", 1, 2, "demand 20 > 16")]
    assert parse_decisions(records) == expected
    assert parse_decisions({"decisions": records}) == expected
    assert parse_decisions({"something": 1}) == []


def test_the_autoscalers_file_is_read_by_its_epoch_seconds() -> None:
    record = {"time": "2030-01-01T00:00:10.123+00:00", "at": 1893456010.1234, "subset": "v1", "from": 0, "to": 1}
    data = {"groups": {"v1": {"replicas": 1}}, "decisions": [{**record, "reason": "demand 1 > 0"}]}
    assert parse_decisions(data) == [Decision(1893456010.1234, "v1", 0, 1, "demand 1 > 0")]


def test_an_iso_time_is_read_as_epoch_seconds() -> None:
    at = "2030-01-01T00:00:10+00:00"
    (d,) = parse_decisions([{"time": at, "subset": "v1", "from": 0, "to": 1}])
    assert d.time_s == datetime.fromisoformat(at).timestamp()


def test_decisions_are_shifted_to_the_run_clock_and_filtered_by_subset(tmp_path: Path) -> None:
    records = [
        {"time": 1000.0, "subset": "v1", "from": 0, "to": 1},
        {"time": 1001.0, "subset": "v2", "from": 0, "to": 1},
    ]
    (tmp_path / "autoscale.json").write_text(json.dumps(records))
    assert read_decisions(tmp_path, origin_wall_s=990.0, subset="v1") == [Decision(10.0, "v1", 0, 1)]
    assert len(read_decisions(tmp_path)) == 2
    assert read_decisions(tmp_path / "missing") == []
    (tmp_path / "autoscale.json").write_text("[{")  # half written
    assert read_decisions(tmp_path) == []


def test_the_count_is_the_last_decision_at_or_before_the_time() -> None:
    assert count_at(TIMELINE, 0, 5.0) == 0
    assert count_at(TIMELINE, 0, 10.0) == 1
    assert count_at(TIMELINE, 0, 25.0) == 3
    assert count_at(TIMELINE, 0, 99.0) == 0
    assert count_at([], 3, 50.0) == 3  # a fixed group: its start count throughout


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (0.0, 40.0, 10 * 1 + 10 * 3),
        (15.0, 25.0, 5 * 1 + 5 * 3),  # a span that starts and ends between decisions
        (22.0, 28.0, 6 * 3),  # inside one count
        (0.0, 10.0, 0.0),
        (35.0, 30.0, 0.0),  # empty span
    ],
)
def test_replica_seconds_integrate_the_count_over_the_span(start: float, end: float, expected: float) -> None:
    assert replica_seconds(TIMELINE, 0, start, end) == pytest.approx(expected)


def test_a_fixed_group_holds_its_count_for_the_whole_span() -> None:
    assert replica_seconds([], 3, 5.0, 105.0) == pytest.approx(300.0)


def test_the_timeline_shows_the_most_replicas_held_each_second() -> None:
    blip = [Decision(2.5, "v1", 0, 2), Decision(2.7, "v1", 2, 1)]
    assert per_second(blip, 0, 0.0, 5.0) == [0, 0, 2, 1, 1]
    assert per_second(TIMELINE, 0, 8.0, 12.5) == [
        0,
        0,
        1,
        1,
        1,
    ]  # a decision on a second starts it; the last partial one counts
    assert timeline_text([0, 1, 3, 12]) == "013+"


def log_line(at: str, serving: float, model: str = "fraud_mlp") -> str:
    return (
        f"{at} INFO model services.model.cold_start: cold start: {model} v1 serving {serving:.2f} s after spawn "
        f"(import 0.80 s, load+warm 0.30 s)"
    )


def test_cold_starts_are_read_from_the_log_line_in_the_run_clock() -> None:
    text = "\n".join(
        [
            "2030-01-01 12:00:00,000 INFO model services.model.watcher: watching models",
            log_line("2030-01-01 12:00:05,500", 1.25),
            log_line("2030-01-01 12:00:05,500", 1.25, model="digits_cnn"),
            log_line("2030-01-01 12:01:00,000", 1.5),
        ]
    )
    origin = datetime(2030, 1, 1, 12, 0, 0).timestamp()  # local time, as the log's asctime
    starts = parse_cold_starts(text, "model-v1-a", origin, model="fraud_mlp")
    assert starts == [
        ColdStart("model-v1-a", "fraud_mlp", 5.5, 1.25, 0.8, 0.3),
        ColdStart("model-v1-a", "fraud_mlp", 60.0, 1.5, 0.8, 0.3),
    ]
    assert starts[0].spawned_at_s == pytest.approx(4.25)
    assert len(parse_cold_starts(text, "model-v1-a", origin)) == 3


def test_cold_starts_come_from_every_model_replica_log(tmp_path: Path) -> None:
    (tmp_path / "model-v1-a.log").write_text(log_line("2030-01-01 12:00:09,000", 1.0))
    (tmp_path / "model-v1-b.log").write_text(log_line("2030-01-01 12:00:03,000", 2.0))
    (tmp_path / "gateway.log").write_text(log_line("2030-01-01 12:00:01,000", 9.0))
    origin = datetime(2030, 1, 1, 12, 0, 0).timestamp()
    starts = read_cold_starts(tmp_path, origin, "fraud_mlp")
    assert [(c.replica, c.serving_at_s) for c in starts] == [("model-v1-b", 3.0), ("model-v1-a", 9.0)]


def test_a_step_s_reaction_is_the_first_replica_spawned_after_it_serving() -> None:
    starts = [
        ColdStart("a", "m", serving_at_s=4.0, serving_s=1.0, import_s=0, load_warm_s=0),  # spawned at 3, before
        ColdStart("b", "m", serving_at_s=12.5, serving_s=1.5, import_s=0, load_warm_s=0),  # spawned at 11
        ColdStart("c", "m", serving_at_s=12.0, serving_s=0.5, import_s=0, load_warm_s=0),  # spawned at 11.5
        ColdStart("d", "m", serving_at_s=40.0, serving_s=1.0, import_s=0, load_warm_s=0),  # after the span
    ]
    assert reaction_s(10.0, 30.0, starts) == pytest.approx(2.0)
    assert reaction_s(20.0, 30.0, starts) is None
    assert reaction_s(3.0, 5.0, starts) == pytest.approx(1.0)
