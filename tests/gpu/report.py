"""The GPU check's report: lines and tables printed as they come and kept for report.md, figures for figures.json
(bench.lib.results' format), and every part that did not run with the reason it did not."""

from __future__ import annotations

import json
import platform
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.lib import results


def cell(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}" if abs(value) >= 1e-3 else f"{value:.2e}"
    return str(value)


class Report:
    """What one run of the check found, in order."""

    def __init__(self, command: str, machine: str = "") -> None:
        self.command = command
        self.machine = machine or platform.node()
        self.started = datetime.now(UTC)
        self.blocks: list[str] = []
        self.figures: list[dict[str, Any]] = []
        self.skipped: list[str] = []
        self.failed: list[str] = []

    def section(self, title: str) -> None:
        print(f"\n== {title}", flush=True)
        self.blocks.append(f"\n## {title}\n")

    def line(self, text: str) -> None:
        print(text, flush=True)
        self.blocks.append(f"- {text}")

    def skip(self, part: str, why: str) -> None:
        """A part that did not run: one line, `SKIPPED <part>: <why>`, kept for the summary too."""
        self.skipped.append(f"{part}: {why}")
        self.line(f"SKIPPED {part}: {why}")

    def fail(self, what: str) -> None:
        self.failed.append(what)
        self.line(f"FAILED {what}")

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        print(results.format_table(headers, [[cell(v) for v in row] for row in rows]), flush=True)
        self.blocks.append("")
        self.blocks.append("| " + " | ".join(headers) + " |")
        self.blocks.append("|" + "---|" * len(headers))
        for row in rows:
            self.blocks.append("| " + " | ".join(cell(v) for v in row) + " |")
        self.blocks.append("")

    def figure(self, name: str, value: float | None, unit: str, versus: str = "") -> None:
        self.figures.append(results.figure(f"gpu_check.{name}", value, unit, versus, self.command))

    def write(self, out: Path) -> list[Path]:
        """report.md and figures.json under `out`; their paths."""
        out.mkdir(parents=True, exist_ok=True)
        head = [
            f"# GPU check, {self.started:%Y-%m-%d %H:%M} UTC",
            "",
            f"`{self.command}` on {self.machine}",
        ]
        tail = ["\n## Summary\n"]
        tail += [f"- failed: {f}" for f in self.failed] or ["- no check failed"]
        tail += [f"- not run: {s}" for s in self.skipped] or ["- every part ran"]
        report = out / "report.md"
        report.write_text("\n".join([*head, *self.blocks, *tail]) + "\n")
        figures = out / "figures.json"
        figures.write_text(json.dumps({"figures": self.figures}, indent=2) + "\n")
        return [report, figures]
