"""perf_analyzer's command line: zeros as inputs unless the caller names its own input data."""

from __future__ import annotations

from bench.lib.perf_analyzer import display_command, perf_analyzer_command


def test_inputs_are_zeros_unless_input_data_is_given() -> None:
    default = display_command(perf_analyzer_command("m", "127.0.0.1:1", 4))
    assert "--input-data zero" in default and "--concurrency-range 4:4" in default
    own = display_command(perf_analyzer_command("m", "127.0.0.1:1", 1, extra=["--input-data", "data.json"]))
    assert "--input-data data.json" in own and "zero" not in own
