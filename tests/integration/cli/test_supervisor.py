"""The supervisor with trivial child processes: dependency order, restart with backoff, clean stop, orphans."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.cli.stack.specs import ProcessSpec
from services.cli.stack.supervisor import BackoffPolicy, StackError, Supervisor


def child(code: str, name: str, depends_on: list[str] | None = None) -> ProcessSpec:
    return ProcessSpec(name=name, argv=[sys.executable, "-c", code], depends_on=depends_on or [])


SLEEP = "import time; time.sleep(60)"


async def test_starts_in_dependency_order_waiting_for_health(tmp_path: Path) -> None:
    events: list[str] = []
    checks = {"db": 0}

    async def health(spec: ProcessSpec) -> bool:
        if spec.name == "db":  # healthy only on the third check
            checks["db"] += 1
            assert sup.procs["app"].process is None, "app started before db was healthy"
            return checks["db"] >= 3
        return True

    specs = [child(SLEEP, "app", ["db", "cache"]), child(SLEEP, "db"), child(SLEEP, "cache")]
    sup = Supervisor(specs, tmp_path, notify=events.append, health=health, stop_timeout_s=5)
    assert sup.levels() == [["db", "cache"], ["app"]]
    try:
        await sup.start(timeout_s=10)
        assert events[-1] == "app is SERVING"
        assert set(events[:2]) == {"db is SERVING", "cache is SERVING"}
        assert all(m.running for m in sup.procs.values())
        assert (tmp_path / "app.log").read_text().startswith("=== meshserve up: starting app")
    finally:
        await sup.stop()
    assert all(m.process.returncode is not None for m in sup.procs.values())


async def test_crashed_process_restarts_with_exponential_backoff(tmp_path: Path) -> None:
    events: list[str] = []
    policy = BackoffPolicy(initial_s=0.1, factor=2, max_s=10, reset_after_s=30)

    async def health(spec: ProcessSpec) -> bool:
        return True

    crash = child("import sys, time; print('crashing', flush=True); time.sleep(0.2); sys.exit(3)", "flaky")
    sup = Supervisor([crash], tmp_path, policy, notify=events.append, health=health)
    try:
        await sup.start(timeout_s=5)
        await asyncio.sleep(2.0)
        m = sup.procs["flaky"]
        assert m.restarts >= 3
        restarts = [e for e in events if "exited with code 3" in e]
        assert "restarting in 0.1s (restart 1" in restarts[0]
        assert "restarting in 0.2s (restart 2" in restarts[1]
        assert "restarting in 0.4s (restart 3" in restarts[2]
        assert (tmp_path / "flaky.log").read_text().count("=== meshserve up: starting flaky") == m.restarts + 1
    finally:
        await sup.stop()
    assert sup.procs["flaky"].state == "stopped"


async def test_a_stable_run_resets_the_backoff(tmp_path: Path) -> None:
    events: list[str] = []
    policy = BackoffPolicy(initial_s=0.1, factor=10, max_s=10, reset_after_s=0.2)

    async def health(spec: ProcessSpec) -> bool:
        return True

    sup = Supervisor(
        [child("import time; time.sleep(0.3)", "job")], tmp_path, policy, notify=events.append, health=health
    )
    try:
        await sup.start(timeout_s=5)
        await asyncio.sleep(1.5)
    finally:
        await sup.stop()
    delays = [e for e in events if "restarting in" in e]
    assert len(delays) >= 2 and all("restarting in 0.1s" in e for e in delays)


async def test_start_gives_up_with_the_log_tail(tmp_path: Path) -> None:
    policy = BackoffPolicy(initial_s=0.05, max_s=0.1)

    async def health(spec: ProcessSpec) -> bool:
        return False

    sup = Supervisor(
        [child("print('boom: bad config'); raise SystemExit(2)", "broken")],
        tmp_path,
        policy,
        notify=lambda _: None,
        health=health,
    )
    try:
        with pytest.raises(StackError, match="boom: bad config") as info:
            await sup.start(timeout_s=1.0)
        assert "broken not SERVING" in str(info.value)
    finally:
        await sup.stop()


async def test_stop_sends_sigterm_then_kills(tmp_path: Path) -> None:
    events: list[str] = []
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up' + 'now', flush=True); "
        "time.sleep(60)"
    )

    async def health(spec: ProcessSpec) -> bool:
        return spec.name != "stubborn" or "upnow" in (tmp_path / "stubborn.log").read_text()

    sup = Supervisor(
        [child(SLEEP, "polite"), child(stubborn, "stubborn")],
        tmp_path,
        notify=events.append,
        health=health,
        stop_timeout_s=0.5,
    )
    await sup.start(timeout_s=10)
    await sup.stop()
    assert sup.procs["polite"].process.returncode == -15
    assert sup.procs["stubborn"].process.returncode == -9
    assert any("stubborn still running" in e and "killing" in e for e in events)
    assert not any("restarting" in e for e in events)


def test_children_die_with_a_killed_supervisor(tmp_path: Path) -> None:
    script = f"""
import asyncio, sys
from pathlib import Path
from services.cli.stack.supervisor import Supervisor
from services.cli.stack.specs import ProcessSpec

async def main():
    spec = ProcessSpec(name="c", argv=[sys.executable, "-c", "import time; time.sleep(60)"])
    sup = Supervisor([spec], Path({str(tmp_path)!r}), notify=lambda m: None)
    await sup.start(5)
    print(sup.procs["c"].pid, flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""
    supervisor = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child_pid = int(supervisor.stdout.readline())
    finally:
        supervisor.kill()
        supervisor.wait()
    deadline = time.monotonic() + 5
    while _alive(child_pid):
        assert time.monotonic() < deadline, "the child outlived its SIGKILLed supervisor"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (OSError, IndexError):
        return False


async def test_a_missing_binary_is_a_stack_error(tmp_path: Path) -> None:
    sup = Supervisor([ProcessSpec(name="ghost", argv=[str(tmp_path / "no-such-binary")])], tmp_path)
    try:
        with pytest.raises(StackError, match="ghost: cannot start"):
            await sup.start(timeout_s=1)
    finally:
        await sup.stop()


async def test_a_restart_that_cannot_spawn_is_retried(tmp_path: Path) -> None:
    events: list[str] = []
    binary = tmp_path / "tool"
    binary.write_text(f"#!{sys.executable}\nimport time; time.sleep(0.3)\n")
    binary.chmod(0o755)
    policy = BackoffPolicy(initial_s=0.3, factor=1, max_s=0.3)

    async def health(spec: ProcessSpec) -> bool:
        return True

    sup = Supervisor([ProcessSpec(name="tool", argv=[str(binary)])], tmp_path, policy, events.append, health)
    try:
        await sup.start(timeout_s=5)
        binary.unlink()  # the next restart fails to exec
        for _ in range(100):
            if any("could not start" in e for e in events):
                break
            await asyncio.sleep(0.05)
        assert any("could not start" in e for e in events), events
        binary.write_text(f"#!{sys.executable}\nimport time; time.sleep(30)\n")
        binary.chmod(0o755)
        for _ in range(100):
            if sup.procs["tool"].running:
                break
            await asyncio.sleep(0.05)
        assert sup.procs["tool"].running, events
        assert any("exited with code none (it did not start)" in e for e in events)
    finally:
        await sup.stop()
