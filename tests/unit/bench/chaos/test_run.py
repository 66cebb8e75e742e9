"""bench.chaos.run's command line: the durations --quick and the per-part flags give."""

from __future__ import annotations

from bench.chaos import run as chaos


def test_quick_shortens_every_duration_and_flags_override_one() -> None:
    quick = chaos.durations(chaos.parse(["--quick"]))
    full = chaos.durations(chaos.parse([]))
    assert all(getattr(quick, k) <= getattr(full, k) for k in full.__dict__)
    assert chaos.parse(["--quick"]).levels == [0.5] and chaos.parse([]).levels == [0.5, 0.9]
    assert chaos.durations(chaos.parse(["--quick", "--stop-s", "10"])).stop == 10.0
