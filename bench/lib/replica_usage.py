"""What a stack's model replicas use while a benchmark runs: a thread samples /proc each second (CPU and RSS of every
model-service process below the stack's supervisor, and the CPU of the children it has reaped), and pure functions
turn the samples into CPU-seconds, memory-seconds and process-seconds over any span.

A replica that stops between two samples is counted whole: its own CPU up to the earlier sample, and what it spent
after, from the growth of the supervisor's reaped-children CPU (cutime + cstime, proc(5)), which grows by a child's
whole CPU when the supervisor waits for it (that growth is looked at only over intervals in which a replica went
away: the supervisor may reap other short-lived children too).

    with UsageSampler(stack.process.pid, origin=time.perf_counter()) as sampler:
        ...  # the load
    cpu_s = cpu_seconds(sampler.snapshots, start_s, end_s)
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

PROC = Path("/proc")
TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
MODEL_MARKER = "services.model"  # the model service's argv: python -m services.model
GIB = float(1 << 30)


@dataclass(frozen=True, slots=True)
class Stat:
    """The fields of one /proc/<pid>/stat this module reads."""

    pid: int
    ppid: int
    cpu_ticks: int  # utime + stime
    reaped_ticks: int  # cutime + cstime: the children it has waited for
    start_ticks: int  # since boot: tells a reused pid from the process before
    rss_pages: int


def parse_stat(text: str) -> Stat:
    """One /proc/<pid>/stat line; fields are counted after the command name's last ')' (proc(5): ppid is field 4,
    utime 14, stime 15, cutime 16, cstime 17, starttime 22, rss 24)."""
    head, _, tail = text.rpartition(")")
    f = tail.split()
    return Stat(
        pid=int(head.split(" (", 1)[0]),
        ppid=int(f[1]),
        cpu_ticks=int(f[11]) + int(f[12]),
        reaped_ticks=int(f[13]) + int(f[14]),
        start_ticks=int(f[19]),
        rss_pages=int(f[21]),
    )


@dataclass(frozen=True, slots=True)
class ProcUsage:
    """One model replica process at one sample."""

    pid: int
    start_ticks: int
    cpu_s: float
    rss_bytes: int

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.start_ticks)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One sample: its time (run clock), the model processes alive, the supervisor's reaped-children CPU."""

    t_s: float
    procs: tuple[ProcUsage, ...]
    reaped_cpu_s: float = 0.0


def interval_cpu_s(a: Snapshot, b: Snapshot) -> float:
    """CPU seconds the model processes spent between two samples: the growth of each one alive at `b` (all of its
    CPU when it started in between), plus, when some of those alive at `a` are gone, what they spent after it (the
    reaped CPU's growth less their CPU at `a`, never below 0: a process reaped by another parent leaves no trace
    there). With none gone the reaped CPU is not looked at: it is then another child's (a process the supervisor
    ran for a moment)."""
    before = {p.key: p.cpu_s for p in a.procs}
    alive = {p.key for p in b.procs}
    grown = sum(p.cpu_s - before.get(p.key, 0.0) for p in b.procs)
    gone = [cpu for key, cpu in before.items() if key not in alive]
    return grown + (max(0.0, b.reaped_cpu_s - a.reaped_cpu_s - sum(gone)) if gone else 0.0)


def _overlap(a: Snapshot, b: Snapshot, start: float, end: float) -> float:
    """The share of the interval (a, b] inside [start, end)."""
    width = b.t_s - a.t_s
    if width <= 0:
        return 0.0
    return max(0.0, min(b.t_s, end) - max(a.t_s, start)) / width


def _pairs(snapshots: Sequence[Snapshot]) -> list[tuple[Snapshot, Snapshot]]:
    return list(itertools.pairwise(snapshots))


def cpu_seconds(snapshots: Sequence[Snapshot], start: float, end: float) -> float:
    """The model processes' CPU seconds in [start, end), each interval's share by its overlap with the span."""
    return sum(interval_cpu_s(a, b) * _overlap(a, b, start, end) for a, b in _pairs(snapshots))


def memory_gib_seconds(snapshots: Sequence[Snapshot], start: float, end: float) -> float:
    """The model processes' resident memory integrated over [start, end), in GiB-seconds (each interval at the RSS
    of its closing sample)."""
    total = 0.0
    for a, b in _pairs(snapshots):
        total += sum(p.rss_bytes for p in b.procs) / GIB * (b.t_s - a.t_s) * _overlap(a, b, start, end)
    return total


def process_seconds(snapshots: Sequence[Snapshot], start: float, end: float) -> float:
    """Model processes alive, integrated over [start, end) (each interval at its closing sample's count)."""
    return sum(len(b.procs) * (b.t_s - a.t_s) * _overlap(a, b, start, end) for a, b in _pairs(snapshots))


def most_alive(snapshots: Sequence[Snapshot], start: float, end: float) -> int:
    """The most model processes any sample in [start, end) saw."""
    return max((len(s.procs) for s in snapshots if start <= s.t_s < end), default=0)


# ----------------------------------------------------------------------------- reading /proc


def read_stat(pid: int, proc: Path = PROC) -> Stat | None:
    try:
        return parse_stat((proc / str(pid) / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def is_model(pid: int, proc: Path = PROC, marker: str = MODEL_MARKER) -> bool:
    """Whether the process's argv holds `marker` as one argument (python -m services.model)."""
    try:
        return marker.encode() in (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


@dataclass
class UsageSampler:
    """Samples the model processes below `root_pid` every `interval_s` on a thread of its own, into `snapshots`.

    Args:
        root_pid: the stack's supervisor (`meshserve up`'s pid).
        origin: time.perf_counter() at the run's start; snapshot times are seconds since it.
        interval_s: how often to sample.
    """

    root_pid: int
    origin: float
    interval_s: float = 1.0
    proc: Path = PROC
    snapshots: list[Snapshot] = field(default_factory=list)
    _known: dict[tuple[int, int], bool] = field(default_factory=dict)  # (pid, start) -> is a model replica
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> Snapshot:
        """One snapshot now (appended to `snapshots`)."""
        stats = [s for e in self.proc.iterdir() if e.name.isdigit() and (s := read_stat(int(e.name), self.proc))]
        below = descendants(self.root_pid, stats)
        procs = []
        for s in stats:
            if s.pid not in below:
                continue
            key = (s.pid, s.start_ticks)
            if key not in self._known:
                self._known[key] = is_model(s.pid, self.proc)
            if self._known[key]:
                procs.append(ProcUsage(s.pid, s.start_ticks, s.cpu_ticks / TICKS_PER_S, s.rss_pages * PAGE_BYTES))
        root = next((s for s in stats if s.pid == self.root_pid), None)
        reaped = root.reaped_ticks / TICKS_PER_S if root is not None else 0.0
        snap = Snapshot(time.perf_counter() - self.origin, tuple(procs), reaped)
        self.snapshots.append(snap)
        return snap

    def alive(self) -> int:
        """Model processes in the latest snapshot (0 before the first)."""
        return len(self.snapshots[-1].procs) if self.snapshots else 0

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> UsageSampler:
        self._thread = threading.Thread(target=self._loop, name="replica-usage", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()  # a last one at the end


def descendants(root: int, stats: Sequence[Stat]) -> set[int]:
    """Every process below `root` (not `root` itself)."""
    children: dict[int, list[int]] = {}
    for s in stats:
        children.setdefault(s.ppid, []).append(s.pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found
