"""Record benchmark figures in bench/results/latest.json (merged by name) and print aligned tables."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
LATEST = RESULTS_DIR / "latest.json"


def load(path: Path = LATEST) -> dict[str, dict[str, Any]]:
    """The figures recorded so far, keyed by name (empty when the file is missing or unreadable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    figures = data.get("figures", []) if isinstance(data, dict) else data
    return {f["name"]: f for f in figures if isinstance(f, dict) and "name" in f}


def figure(
    name: str, value: float | int | None, unit: str, compared_with: str = "", command: str = ""
) -> dict[str, Any]:
    """One figure as stored: name, value, unit, what it was compared with, the command, the time."""
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "compared_with": compared_with,
        "command": command,
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def record(figures: Iterable[dict[str, Any]], path: Path = LATEST) -> Path:
    """Merge figures into the results file by name (a new figure replaces an older one of that name)."""
    merged = load(path)
    for f in figures:
        merged[f["name"]] = f
    path.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"figures": sorted(merged.values(), key=lambda f: f["name"])}, indent=2) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".latest-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        fh.write(body)
    os.replace(tmp, path)
    return path


def record_one(
    name: str, value: float | int | None, unit: str, compared_with: str = "", command: str = ""
) -> dict[str, Any]:
    """Record a single figure at once and return it."""
    f = figure(name, value, unit, compared_with, command)
    record([f])
    return f


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """An aligned text table: the first column left-aligned, the others right-aligned."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        pairs = enumerate(zip(r, widths, strict=True))
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs)

    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], title: str = "") -> None:
    """Print format_table(), with an optional title line above it."""
    if title:
        print(f"\n{title}")
    print(format_table(headers, rows), flush=True)


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing (or b is 0)."""
    return a / b if a is not None and b else None
