"""The numpy decoder: read.lua's replies -> every aggregate of every row, bucket records windowed in numpy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from services.feature.store.layout import BAND
from services.feature.store.plan import ReplyLayout

Members = tuple[np.ndarray, np.ndarray, np.ndarray]  # (owner row, bucket index in the row's span, record) each


@dataclass
class AggregateResult:
    """Per aggregate feature (by feature index): values for every row, and where the default was taken."""

    values: dict[int, np.ndarray]
    defaulted: np.ndarray  # (rows,) bool


def decode(layout: ReplyLayout, ts: np.ndarray, replies: Sequence[Sequence[Any]]) -> AggregateResult:
    """The aggregates of rows at times `ts` from the replies of read.lua's calls (their chunks in row order)."""
    rows, nranges = len(ts), len(layout.ranges)
    members = [b"".join(reply[0][ri] for reply in replies) for ri in range(nranges)]
    counts = np.fromiter(chain.from_iterable(reply[1] for reply in replies), dtype=np.int64, count=rows * nranges)
    numbers = list(chain.from_iterable(reply[2] for reply in replies))
    return windowed(layout, ts, members, counts, numbers)


def group_members(layout: ReplyLayout, members: list[bytes], counts: np.ndarray, ts: np.ndarray) -> dict[int, Members]:
    """Per windowed group: (owner row, bucket index in the row's window span, record) of each member read.

    A member is its score (see layout.py) then its record (doubles, zero-padded); row r owns counts[r, p] of
    range p's members, in row order. The bucket index is 0 for the span's oldest bucket, buckets - 1 for the
    newest (the span is the group's longest window); buckets after it (read with it) index past the end.
    """
    rows = len(ts)
    decoded = {}
    for p, (width, groups) in enumerate(layout.ranges):
        if not groups:
            continue
        got = np.frombuffer(members[p], dtype="<f8").reshape(-1, 1 + width)
        owner = np.repeat(np.arange(rows), counts[:, p])
        score = got[:, 0].astype(np.int64)
        band = score // BAND
        offset = score - band * BAND
        for gi, b in groups:
            g = layout.groups[gi]
            mine = band == b
            number = BAND - 1 - offset[mine] if b % 2 else offset[mine]
            o = owner[mine]
            decoded[gi] = (o, number - (ts // g.bucket_s - g.buckets)[o], got[mine, 1:])
    return decoded


def windowed(
    layout: ReplyLayout, ts: np.ndarray, members: list[bytes], counts: np.ndarray, numbers: list[int]
) -> AggregateResult:
    """Every aggregate of every row from the read script's replies joined per range.

    A window's members are summed into their rows with bincount (maxima with maximum.at): no per-row loop and
    no (rows, buckets) table to fill.
    """
    rows = len(ts)
    decoded = group_members(layout, members, counts.reshape(rows, len(layout.ranges)), ts)
    windows: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # (group, first) -> inside
    values: dict[int, np.ndarray] = {}
    defaulted = np.zeros(rows, dtype=bool)
    for fi, op, default, gi, first, col in layout.windowed:
        window = windows.get((gi, first))
        if window is None:
            owner, at, records = decoded[gi]
            inside = (at >= first) & (at < layout.groups[gi].buckets)
            owner, records = owner[inside], records[inside]
            window = windows[(gi, first)] = (owner, records, np.bincount(owner, records[:, 0], minlength=rows))
        owner, records, count = window
        if op == "count":
            values[fi] = count
            continue
        if op == "sum":
            values[fi] = np.bincount(owner, records[:, col], minlength=rows)
            continue
        empty = count == 0
        if op == "max":
            best = np.full(rows, -np.inf)
            np.maximum.at(best, owner, records[:, col])
            values[fi] = np.where(empty, default, best)
        else:  # mean
            total = np.bincount(owner, records[:, col], minlength=rows)
            with np.errstate(invalid="ignore", over="ignore"):  # records the store mangled (FeatureSet.finish degrades)
                values[fi] = np.where(empty, default, total / np.where(empty, 1.0, count))
        defaulted |= empty
    if layout.scalars:
        others = np.array(numbers, dtype=np.float64).reshape(rows, len(layout.scalars))
        empty = others < 0
        for j, (fi, default) in enumerate(layout.scalars):
            values[fi] = np.where(empty[:, j], default, others[:, j])
        defaulted |= empty.any(axis=1)
    return AggregateResult(values, defaulted)
