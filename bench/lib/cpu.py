"""CPU time of processes from /proc/<pid>/stat (utime + stime, children excluded), per request and as a price.

A benchmark takes a `snapshot()` of every process before and after a timed window; `spent()` turns the two into
CPU seconds per process, which the caller sums per service and divides by the answers counted in the same window.

    before = snapshot()
    ...  # the timed window
    seconds = spent(before, snapshot())
    ms = per_request_ms(group_seconds(seconds, {pid: "gateway", ...}), answers)
    usd = cost_per_million(ms["total"], USD_PER_VCPU_HOUR)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # utime and stime count these per second
TOTAL = "total"

# The default price of a vCPU-hour: AWS EC2 On-Demand, Linux, us-east-1, m7i (general purpose, Intel), half of
# m7i.large's $0.1008 an hour for 2 vCPUs. The rate as a 2026 comparison quotes it (m7i.xlarge $0.2016/h for 4 vCPUs,
# https://c3x.dev/blog/m5-vs-m6i-vs-m7i-cost-performance); AWS's own table: https://aws.amazon.com/ec2/pricing/on-demand/.
# Not re-read since: pass --usd-per-vcpu-hour for another instance, region or date.
USD_PER_VCPU_HOUR = 0.0504
PRICE_SOURCE = "AWS EC2 on-demand, Linux, us-east-1, m7i.large: $0.1008/h for 2 vCPUs"


@dataclass(frozen=True)
class ProcStat:
    """One process as /proc/<pid>/stat shows it at one moment."""

    pid: int
    comm: str
    ppid: int
    session: int
    cpu_ticks: int  # utime + stime: its own threads' CPU, not its reaped children's (cutime, cstime)
    start_ticks: int  # starttime since boot: tells a reused pid from the process sampled before


def parse_stat(text: str) -> ProcStat:
    """The fields of one /proc/<pid>/stat line that CPU accounting needs.

    The command name sits in parentheses and may itself hold spaces and parentheses, so the fields after it are
    counted from its last ')' (proc(5): state is field 3, ppid 4, session 6, utime 14, stime 15, starttime 22).
    """
    head, _, tail = text.rpartition(")")
    pid, _, comm = head.partition(" (")
    fields = tail.split()
    return ProcStat(
        pid=int(pid),
        comm=comm,
        ppid=int(fields[1]),
        session=int(fields[3]),
        cpu_ticks=int(fields[11]) + int(fields[12]),
        start_ticks=int(fields[19]),
    )


def read_stat(pid: int, proc: Path = PROC) -> ProcStat | None:
    """The process `pid` now, or None when it is gone (or was never there)."""
    try:
        return parse_stat((proc / str(pid) / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def snapshot(proc: Path = PROC) -> dict[int, ProcStat]:
    """Every process visible in `proc` now, by pid."""
    out: dict[int, ProcStat] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            stat = read_stat(int(entry.name), proc)
            if stat is not None:
                out[stat.pid] = stat
    return out


def cmdline(pid: int, proc: Path = PROC) -> str:
    """The process's command line as it shows it now (a process may rewrite it, as Ray's workers do), or ""."""
    try:
        return (proc / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def tree(root: int, stats: Mapping[int, ProcStat]) -> set[int]:
    """`root` and every process below it, and, when `root` leads a session, every other process of that session
    (one whose parent exited and which was handed to init or a subreaper)."""
    if root not in stats:
        return set()
    children: dict[int, list[int]] = {}
    for s in stats.values():
        children.setdefault(s.ppid, []).append(s.pid)
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    if stats[root].session == root:
        found |= {s.pid for s in stats.values() if s.session == root}
    return found


def spent(
    before: Mapping[int, ProcStat], after: Mapping[int, ProcStat], ticks_per_s: int = CLOCK_TICKS
) -> dict[int, float]:
    """CPU seconds each process of `after` spent since `before`: all of its CPU when it started in between (or its
    pid now names another process); a process that ended in between is not counted."""
    out: dict[int, float] = {}
    for pid, now in after.items():
        then = before.get(pid)
        base = then.cpu_ticks if then is not None and then.start_ticks == now.start_ticks else 0
        out[pid] = max(0, now.cpu_ticks - base) / ticks_per_s
    return out


def group_seconds(seconds: Mapping[int, float], group_of: Mapping[int, str]) -> dict[str, float]:
    """CPU seconds summed per group (a pid `group_of` leaves out is not counted), and their `total`."""
    out: dict[str, float] = {}
    for pid, s in seconds.items():
        group = group_of.get(pid)
        if group is not None:
            out[group] = out.get(group, 0.0) + s
    out[TOTAL] = sum(out.values())
    return out


def per_request_ms(seconds: Mapping[str, float], answers: int) -> dict[str, float] | None:
    """Each group's CPU milliseconds per answered request; None without answers."""
    if answers <= 0:
        return None
    return {group: 1000.0 * s / answers for group, s in seconds.items()}


def cost_per_million(cpu_ms_per_request: float, usd_per_vcpu_hour: float) -> float:
    """What a million requests cost in CPU at a price per vCPU-hour: ms x 1e6 / 3.6e6 ms per hour x price."""
    return cpu_ms_per_request * 1e6 / 3.6e6 * usd_per_vcpu_hour


class Window:
    """CPU seconds per group of processes over one timed window: `start()` at its beginning, `stop()` at its end.

    Args:
        groups: pid -> group of the processes to count, from the snapshot taken at the window's end (so that a
            process started during the window, a Ray worker say, is counted with all of its CPU).
        proc: where the processes are read (/proc).

    Example:
        window = Window(lambda stats: {pid: "ray" for pid in tree(root, stats)})
        window.start()
        ...  # the timed window
        seconds = window.stop()  # {"ray": 1.73, "total": 1.73}
    """

    def __init__(self, groups: Callable[[Mapping[int, ProcStat]], Mapping[int, str]], proc: Path = PROC) -> None:
        self.groups = groups
        self.proc = proc
        self.before: dict[int, ProcStat] = {}

    def start(self) -> None:
        self.before = snapshot(self.proc)

    def stop(self) -> dict[str, float]:
        after = snapshot(self.proc)
        return group_seconds(spent(self.before, after), self.groups(after))
