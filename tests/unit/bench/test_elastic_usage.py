"""bench.lib.replica_usage: /proc's stat line, the model replicas' CPU-, memory- and process-seconds over a span from
samples (a replica that starts or stops between two samples included), and the sampler over a /proc of files."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.lib.replica_usage import (
    PAGE_BYTES,
    TICKS_PER_S,
    ProcUsage,
    Snapshot,
    UsageSampler,
    cpu_seconds,
    descendants,
    interval_cpu_s,
    memory_gib_seconds,
    most_alive,
    parse_stat,
    process_seconds,
)

GIB = 1 << 30


def stat_line(
    pid: int, ppid: int, cpu: int = 0, reaped: int = 0, start: int = 100, rss: int = 0, comm: str = "python"
) -> str:
    # fields 3.. of proc(5): state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime
    # cstime priority nice threads itrealvalue starttime vsize rss
    fields = ["S", ppid, 1, 1, 0, -1, 0, 0, 0, 0, 0, cpu, 0, reaped, 0, 20, 0, 1, 0, start, 0, rss]
    return f"{pid} ({comm}) " + " ".join(str(f) for f in fields) + " 0 0\n"


def test_the_stat_line_is_read_after_the_command_name() -> None:
    s = parse_stat(stat_line(42, 7, cpu=150, reaped=30, start=999, rss=2560, comm="odd) name ("))
    assert (s.pid, s.ppid, s.cpu_ticks, s.reaped_ticks, s.start_ticks, s.rss_pages) == (42, 7, 150, 30, 999, 2560)


def proc(pid: int, cpu: float, rss_gib: float = 0.0, start: int = 1) -> ProcUsage:
    return ProcUsage(pid, start, cpu, int(rss_gib * GIB))


def test_an_interval_counts_growth_new_processes_and_what_the_gone_spent_after_the_first_sample() -> None:
    a = Snapshot(0.0, (proc(1, 10.0), proc(2, 4.0)), reaped_cpu_s=0.0)
    # 1 grew by 0.5; 2 ended with 4.3 s in all (reaped); 3 started and spent 0.2
    b = Snapshot(1.0, (proc(1, 10.5), proc(3, 0.2)), reaped_cpu_s=4.3)
    assert interval_cpu_s(a, b) == pytest.approx(0.5 + 0.2 + 0.3)


def test_what_the_supervisor_reaps_while_no_replica_went_away_is_not_theirs() -> None:
    a = Snapshot(0.0, (proc(1, 10.0),), reaped_cpu_s=1.0)
    b = Snapshot(1.0, (proc(1, 10.5),), reaped_cpu_s=1.3)  # some other child of the supervisor ended
    assert interval_cpu_s(a, b) == pytest.approx(0.5)
    assert interval_cpu_s(Snapshot(0.0, ()), Snapshot(1.0, (), reaped_cpu_s=0.2)) == 0.0


def test_a_reused_pid_is_a_new_process() -> None:
    a = Snapshot(0.0, (proc(1, 10.0, start=1),))
    b = Snapshot(1.0, (proc(1, 0.4, start=2),))
    assert interval_cpu_s(a, b) == pytest.approx(0.4)  # not -9.6; the first one's end was not reaped here


SNAPS = [
    Snapshot(0.0, ()),
    Snapshot(1.0, (proc(1, 1.0, 0.5),)),
    Snapshot(2.0, (proc(1, 2.0, 0.5), proc(2, 0.5, 0.25))),
    Snapshot(3.0, (proc(1, 2.5, 0.5), proc(2, 1.0, 0.25))),
    Snapshot(4.0, (), reaped_cpu_s=4.0),  # both ended by 4.0 with 3.0 + 1.0 s
    Snapshot(5.0, (), reaped_cpu_s=4.0),
]


def test_cpu_memory_and_process_seconds_over_a_span() -> None:
    assert cpu_seconds(SNAPS, 0.0, 5.0) == pytest.approx(4.0)
    assert cpu_seconds(SNAPS, 1.0, 3.0) == pytest.approx((1.0 + 0.5) + (0.5 + 0.5))
    assert cpu_seconds(SNAPS, 4.0, 5.0) == 0.0  # nothing runs at zero
    assert cpu_seconds(SNAPS, 1.5, 2.0) == pytest.approx(1.5 / 2)  # half of an interval's CPU
    assert memory_gib_seconds(SNAPS, 0.0, 5.0) == pytest.approx(0.5 + 0.75 + 0.75)
    assert process_seconds(SNAPS, 0.0, 5.0) == pytest.approx(1 + 2 + 2)
    assert most_alive(SNAPS, 0.0, 5.0) == 2 and most_alive(SNAPS, 4.0, 6.0) == 0


def test_descendants_are_every_process_below_the_root() -> None:
    stats = [parse_stat(stat_line(p, pp)) for p, pp in [(10, 1), (11, 10), (12, 11), (13, 10), (20, 1)]]
    assert descendants(10, stats) == {11, 12, 13}
    assert descendants(99, stats) == set()


def fake_proc(root: Path, pid: int, ppid: int, argv: list[str], cpu: int, rss: int, reaped: int = 0) -> None:
    folder = root / str(pid)
    folder.mkdir(exist_ok=True)
    (folder / "stat").write_text(stat_line(pid, ppid, cpu=cpu, rss=rss, reaped=reaped))
    (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


def test_the_sampler_sees_only_model_processes_below_the_supervisor(tmp_path: Path) -> None:
    fake_proc(tmp_path, 100, 1, ["python", "-m", "services.cli.main", "up"], 0, 0, reaped=3 * TICKS_PER_S)
    fake_proc(tmp_path, 101, 100, ["python", "-m", "services.model"], 2 * TICKS_PER_S, 1000)
    fake_proc(tmp_path, 102, 100, ["python", "-m", "services.gateway"], 9 * TICKS_PER_S, 5000)
    fake_proc(tmp_path, 200, 1, ["python", "-m", "services.model"], 9 * TICKS_PER_S, 5000)  # another stack's
    (tmp_path / "self").mkdir()
    sampler = UsageSampler(100, origin=0.0, proc=tmp_path)
    snap = sampler.sample()
    assert [(p.pid, p.cpu_s, p.rss_bytes) for p in snap.procs] == [(101, 2.0, 1000 * PAGE_BYTES)]
    assert snap.reaped_cpu_s == 3.0
    assert sampler.alive() == 1 and sampler.snapshots == [snap]


def test_cpu_at_zero_counts_between_the_samples_inside_the_span_only() -> None:
    from bench.lib.elastic_report import StackResult, idle_cpu

    stack = StackResult("elastic", 0, Path("."), 0.0, 0.0)
    stack.snapshots = [
        Snapshot(0.0, (proc(1, 4.5),)),
        Snapshot(1.0, (), reaped_cpu_s=4.65),  # the last replica exited (0.15 s of drain after the first sample)
        Snapshot(2.0, (), reaped_cpu_s=4.65),
        Snapshot(3.0, (), reaped_cpu_s=4.65),
        Snapshot(4.0, (proc(2, 0.9),), reaped_cpu_s=4.65),  # the next load's replica, started after the span
    ]
    assert idle_cpu(stack, [(1.2, 3.5)]) == 0.0  # neither the exit nor the start is the sleep's
    assert idle_cpu(stack, []) is None
    stack.snapshots[2] = Snapshot(2.0, (proc(3, 0.3),), reaped_cpu_s=4.65)  # a replica alive while "asleep"
    assert idle_cpu(stack, [(1.0, 3.0)]) == pytest.approx(0.3)  # its CPU counts, its exit included
