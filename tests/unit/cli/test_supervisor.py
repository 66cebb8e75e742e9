"""The supervisor's plan without starting anything: backoff delays, dependency levels, refused specs.

Tests that start child processes are in tests/integration/cli/test_supervisor.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from services.cli.stack.specs import ProcessSpec
from services.cli.stack.supervisor import BackoffPolicy, Supervisor, tail


def child(code: str, name: str, depends_on: list[str] | None = None) -> ProcessSpec:
    return ProcessSpec(name=name, argv=[sys.executable, "-c", code], depends_on=depends_on or [])


SLEEP = "import time; time.sleep(60)"


def test_backoff_grows_to_its_cap() -> None:
    policy = BackoffPolicy(initial_s=0.5, factor=2, max_s=5)
    assert [policy.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_dependency_cycles_and_unknown_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown"):
        Supervisor([child(SLEEP, "a", ["x"])], tmp_path)
    with pytest.raises(ValueError, match="cycle"):
        Supervisor([child(SLEEP, "a", ["b"]), child(SLEEP, "b", ["a"])], tmp_path).levels()


def test_levels_group_processes_by_dependency(tmp_path: Path) -> None:
    specs = [
        child(SLEEP, "app", ["db", "cache"]),
        child(SLEEP, "db"),
        child(SLEEP, "cache"),
        child(SLEEP, "x", ["app"]),
    ]
    assert Supervisor(specs, tmp_path).levels() == [["db", "cache"], ["app"], ["x"]]
    with pytest.raises(ValueError, match="duplicate"):
        Supervisor([child(SLEEP, "a"), child(SLEEP, "a")], tmp_path)


def test_tail_shows_the_log_since_the_last_start(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("=== meshserve up: starting a\nold\n=== meshserve up: starting a\nnew 1\nnew 2\n")
    assert tail(log) == "=== meshserve up: starting a\nnew 1\nnew 2"
    assert tail(log, lines=1) == "new 2"
    assert tail(tmp_path / "none.log") == "(no log)"
