"""bench.chaos.script: the faults in the order the chaos run injects them, and how long a full run lasts."""

from __future__ import annotations

from bench.chaos import script


def test_the_full_run_fits_in_twelve_minutes_of_phases() -> None:
    d = script.Durations()
    per_level = d.settle + d.quiet

    def length(step: script.Step) -> float:
        return getattr(d, step.length) if step.length else d.lead + (getattr(d, step.hold) if step.hold else 0) + d.tail

    for step in script.SCRIPT:
        per_level += length(step)
    assert 2 * per_level + sum(length(s) for s in script.FINAL) + d.warmup <= 600


def test_the_script_is_the_documented_sequence() -> None:
    assert [s.name for s in script.SCRIPT] == [
        "kill model replica",
        "stop model replica",
        "kill valkey",
        "stop feature",
        "kill cache",
        "kill gateway",
        "hot-load version",
        "canary 10%",
        "canary 50%",
        "canary 100%",
        "canary rollback",
        "overload 3x",
    ]
    assert all(s.end is not None for s in script.SCRIPT if s.hold)
    assert [s.name for s in script.FINAL] == ["flushall valkey"]  # once, after every level
    assert all(s.end is not None for s in script.FINAL)
