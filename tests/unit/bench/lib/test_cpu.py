"""bench.lib.cpu: /proc/<pid>/stat read into CPU ticks, two snapshots into CPU seconds per process and per group,
process trees, CPU per request and its price, on a /proc written by the test (and the real one for this process)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.lib import cpu


def stat_line(pid: int, comm: str, ppid: int, session: int, utime: int, stime: int, start: int) -> str:
    """A /proc/<pid>/stat line as the kernel writes it (52 fields; the ones not read are zeros or made up)."""
    # fields 3..: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime
    # priority nice num_threads itrealvalue starttime, then the rest
    after = ["S", ppid, ppid, session, 0, -1, 4194560, 10, 0, 0, 0, utime, stime, 777, 888, 20, 0, 4, 0, start]
    return f"{pid} ({comm}) " + " ".join(str(v) for v in after + [0] * 32) + "\n"


def write_proc(root: Path, *processes: tuple[int, str, int, int, int, int, int]) -> Path:
    """A fake /proc: one <pid>/stat per process (and entries that are not processes, as the real one has)."""
    for old in root.glob("*/stat"):
        old.unlink()
    for pid, comm, ppid, session, utime, stime, start in processes:
        (root / str(pid)).mkdir(parents=True, exist_ok=True)
        (root / str(pid) / "stat").write_text(stat_line(pid, comm, ppid, session, utime, stime, start))
    (root / "self").mkdir(exist_ok=True)
    (root / "uptime").write_text("1.0 1.0\n")
    return root


def test_a_stat_line_gives_its_process_own_cpu_without_its_childrens() -> None:
    stat = cpu.parse_stat(stat_line(42, "python", 7, 7, utime=150, stime=25, start=9000))

    assert stat == cpu.ProcStat(pid=42, comm="python", ppid=7, session=7, cpu_ticks=175, start_ticks=9000)
    # cutime and cstime (777, 888: the reaped children's) are left out


def test_a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields() -> None:
    stat = cpu.parse_stat(stat_line(5, "ray::Serve) (x", 1, 5, utime=3, stime=4, start=11))

    assert (stat.comm, stat.ppid, stat.cpu_ticks, stat.start_ticks) == ("ray::Serve) (x", 1, 7, 11)


def test_this_process_reads_from_the_real_proc() -> None:
    stat = cpu.read_stat(os.getpid())

    assert stat is not None and stat.pid == os.getpid() and stat.ppid == os.getppid()
    assert stat.cpu_ticks > 0  # importing pytest alone takes more than a tick
    assert os.getpid() in cpu.snapshot()


def test_a_process_that_is_not_there_reads_as_none(tmp_path: Path) -> None:
    assert cpu.read_stat(123, write_proc(tmp_path)) is None


def test_spent_counts_each_process_from_its_first_sample_or_from_its_start() -> None:
    before = {
        1: cpu.ProcStat(1, "gateway", 0, 1, cpu_ticks=1000, start_ticks=50),
        2: cpu.ProcStat(2, "reused", 0, 1, cpu_ticks=5000, start_ticks=60),
        3: cpu.ProcStat(3, "ended", 0, 1, cpu_ticks=300, start_ticks=70),
    }
    after = {
        1: cpu.ProcStat(1, "gateway", 0, 1, cpu_ticks=1250, start_ticks=50),  # 250 ticks in the window
        2: cpu.ProcStat(2, "new owner", 0, 1, cpu_ticks=40, start_ticks=999),  # another process under pid 2
        4: cpu.ProcStat(4, "worker", 0, 1, cpu_ticks=30, start_ticks=1000),  # started in the window
    }

    assert cpu.spent(before, after, ticks_per_s=100) == {1: 2.5, 2: 0.4, 4: 0.3}


def test_group_seconds_sums_replicas_and_leaves_out_processes_of_no_group() -> None:
    seconds = {10: 1.0, 11: 0.5, 20: 0.25, 99: 7.0}

    groups = cpu.group_seconds(seconds, {10: "model", 11: "model", 20: "Valkey"})

    assert groups == {"model": 1.5, "Valkey": 0.25, cpu.TOTAL: 1.75}


def test_per_request_ms_divides_by_the_answers_and_none_without_any() -> None:
    assert cpu.per_request_ms({"gateway": 0.27, cpu.TOTAL: 0.94}, answers=100) == {
        "gateway": pytest.approx(2.7),
        cpu.TOTAL: pytest.approx(9.4),
    }
    assert cpu.per_request_ms({cpu.TOTAL: 1.0}, answers=0) is None


def test_a_million_requests_of_3_6_ms_each_are_one_vcpu_hour() -> None:
    assert cpu.cost_per_million(3.6, usd_per_vcpu_hour=0.05) == pytest.approx(0.05)
    # the table: 9.40 ms per request at the default price
    assert cpu.cost_per_million(9.40, cpu.USD_PER_VCPU_HOUR) == pytest.approx(9.40 / 3.6 * 0.0504)
    assert cpu.cost_per_million(0.0, 1.0) == 0.0


def test_the_default_price_is_half_an_m7i_large_hour() -> None:
    assert cpu.USD_PER_VCPU_HOUR == pytest.approx(0.1008 / 2)
    assert "m7i.large" in cpu.PRICE_SOURCE


def test_a_tree_is_a_process_its_descendants_and_the_rest_of_the_session_it_leads() -> None:
    stats = {
        s.pid: s
        for s in (
            cpu.ProcStat(1, "init", 0, 1, 0, 0),
            cpu.ProcStat(100, "driver", 1, 100, 0, 0),  # leads session 100
            cpu.ProcStat(101, "raylet", 100, 100, 0, 0),
            cpu.ProcStat(102, "ray::Model", 101, 100, 0, 0),  # a grandchild
            cpu.ProcStat(103, "gcs_server", 1, 100, 0, 0),  # handed to init, still in the session
            cpu.ProcStat(200, "other", 1, 200, 0, 0),
            cpu.ProcStat(201, "other child", 200, 200, 0, 0),
        )
    }

    assert cpu.tree(100, stats) == {100, 101, 102, 103}
    assert cpu.tree(101, stats) == {101, 102}  # not a session leader: its descendants only
    assert cpu.tree(999, stats) == set()


def test_a_window_counts_the_cpu_between_start_and_stop_by_group(tmp_path: Path) -> None:
    proc = write_proc(tmp_path, (10, "gateway", 1, 1, 100, 20, 5), (11, "envoy", 1, 1, 50, 50, 6))
    window = cpu.Window(lambda stats: {pid: stats[pid].comm for pid in stats}, proc)

    window.start()
    write_proc(tmp_path, (10, "gateway", 1, 1, 160, 30, 5), (11, "envoy", 1, 1, 70, 50, 6), (12, "new", 1, 1, 9, 1, 7))
    seconds = window.stop()

    in_ticks = {group: s * cpu.CLOCK_TICKS for group, s in seconds.items()}
    assert in_ticks == pytest.approx({"gateway": 70, "envoy": 20, "new": 10, cpu.TOTAL: 100})
