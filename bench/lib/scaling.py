"""A scaling run's replica counts and cold starts: the autoscaler's decisions (autoscale.json) as a count over time,
replica-seconds over a span, a per-second timeline, the model replicas' cold starts from their logs, and how long a
load step waited for an added replica to serve.

Times are seconds since the run's origin (the caller shifts wall-clock times by it), so the load's samples, the
decisions, the logs and /proc samples share one clock.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

AUTOSCALE_FILE = "autoscale.json"


@dataclass(frozen=True, slots=True)
class Decision:
    """One decision of the autoscaler: at `time_s` the `subset` went from `before` to `after` replicas."""

    time_s: float
    subset: str
    before: int
    after: int
    reason: str = ""


def _number(entry: dict[str, Any], *keys: str) -> float | None:
    for key in keys:
        value = entry.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value).timestamp()
            except ValueError:
                continue
    return None


def parse_decisions(data: Any) -> list[Decision]:
    """The decisions of an autoscale.json document (an object holding them under `decisions`, as `meshserve up`'s
    autoscaler writes it, or a bare list), by time; a record without a time or counts is skipped. The time is `at`
    (epoch seconds), else `time` (epoch seconds or ISO 8601)."""
    records = data.get("decisions", []) if isinstance(data, dict) else data
    out = []
    for entry in records if isinstance(records, list) else []:
        if not isinstance(entry, dict):
            continue
        t = _number(entry, "at", "time", "t", "time_s")
        before = _number(entry, "from", "before", "from_replicas")
        after = _number(entry, "to", "after", "to_replicas")
        if t is None or before is None or after is None:
            continue
        out.append(Decision(t, str(entry.get("subset", "")), int(before), int(after), str(entry.get("reason", ""))))
    return sorted(out, key=lambda d: d.time_s)


def read_decisions(log_dir: Path, origin_wall_s: float = 0.0, subset: str | None = None) -> list[Decision]:
    """The decisions in `<log_dir>/autoscale.json` (none when it is missing or half written), times shifted to the
    run's clock (seconds after `origin_wall_s`), only `subset`'s when one is given."""
    try:
        data = json.loads((log_dir / AUTOSCALE_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [
        replace(d, time_s=d.time_s - origin_wall_s)
        for d in parse_decisions(data)
        if subset is None or d.subset == subset
    ]


def count_at(decisions: Sequence[Decision], initial: int, t: float) -> int:
    """The replica count at `t`: the last decision's at or before it, `initial` before any (decisions by time)."""
    count = initial
    for d in decisions:
        if d.time_s > t:
            break
        count = d.after
    return count


def replica_seconds(decisions: Sequence[Decision], initial: int, start: float, end: float) -> float:
    """The replica count integrated over [start, end): each count times how long it held."""
    if end <= start:
        return 0.0
    total, t, count = 0.0, start, count_at(decisions, initial, start)
    for d in decisions:
        if d.time_s <= start:
            continue
        if d.time_s >= end:
            break
        total += count * (d.time_s - t)
        t, count = d.time_s, d.after
    return total + count * (end - t)


def per_second(decisions: Sequence[Decision], initial: int, start: float, end: float) -> list[int]:
    """The most replicas held during each second of [start, end) (a last partial second included)."""
    out = []
    t = start
    while t < end - 1e-9:
        upper = min(t + 1.0, end)
        inside = [d.after for d in decisions if t < d.time_s < upper]
        out.append(max([count_at(decisions, initial, t), *inside]))
        t = upper
    return out


def timeline_text(counts: Iterable[int]) -> str:
    """One character per second: the count as a digit (`+` above 9)."""
    return "".join(str(c) if 0 <= c <= 9 else "+" for c in counts)


# ----------------------------------------------------------------------------- cold starts from the replicas' logs

# services.model.cold_start's line, after services.common.logs' "%(asctime)s %(levelname)s <service> %(name)s: "
COLD_START_LINE = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*?cold start: (?P<model>\S+) (?P<versions>\S+) serving "
    r"(?P<serving>[\d.]+) s after spawn \(import (?P<import>[\d.]+) s, load\+warm (?P<load>[\d.]+) s\)"
)
LOG_TIME = "%Y-%m-%d %H:%M:%S,%f"
SPAWN_SLACK_S = 0.02  # a spawn time is the log line's millisecond less a duration rounded to 10 ms


@dataclass(frozen=True, slots=True)
class ColdStart:
    """One model replica's start: which, when it said SERVING (run clock), and spawn -> SERVING with its parts."""

    replica: str
    model: str
    serving_at_s: float
    serving_s: float
    import_s: float
    load_warm_s: float

    @property
    def spawned_at_s(self) -> float:
        return self.serving_at_s - self.serving_s


def parse_cold_starts(text: str, replica: str, origin_wall_s: float = 0.0, model: str | None = None) -> list[ColdStart]:
    """Every cold start line of one replica's log (of `model` only, when given), in the run's clock: the line's
    local time less `origin_wall_s`."""
    out = []
    for line in text.splitlines():
        m = COLD_START_LINE.match(line)
        if m is None or (model is not None and m["model"] != model):
            continue
        at = datetime.strptime(m["at"], LOG_TIME).timestamp()  # naive: local time, as asctime wrote it
        out.append(
            ColdStart(
                replica,
                m["model"],
                at - origin_wall_s,
                float(m["serving"]),
                float(m["import"]),
                float(m["load"]),
            )
        )
    return out


def read_cold_starts(log_dir: Path, origin_wall_s: float, model: str, prefix: str = "model") -> list[ColdStart]:
    """The cold starts of `model` in every model replica's log (`<prefix>*.log`) of the stack, by serving time."""
    found: list[ColdStart] = []
    for path in sorted(log_dir.glob(f"{prefix}*.log")):
        found += parse_cold_starts(path.read_text(errors="replace"), path.stem, origin_wall_s, model)
    return sorted(found, key=lambda c: c.serving_at_s)


def reaction_s(step_s: float, until_s: float, starts: Sequence[ColdStart]) -> float | None:
    """From a load step at `step_s` to the first replica spawned at or after it (and before `until_s`) serving;
    None when no replica was added in that span."""
    added = [c.serving_at_s for c in starts if step_s - SPAWN_SLACK_S <= c.spawned_at_s < until_s]
    return min(added) - step_s if added else None
