"""Run `make bench`'s benchmarks in two trees, alternated, and print every figure of both side by side.

`python -m bench.experiments.trees_ab OLD_TREE [--bench model_service cache ...] [--rounds 2]` runs each benchmark
module with each tree's own virtualenv (`<tree>/.venv/bin/python -m bench.<name>`), old then new, then new then old
in the next round, so neither tree always runs on the warmer machine. After each run it reads the figures the
benchmark wrote to `<tree>/bench/results/latest.json` and prints, per figure, both trees' values of each round
and new/old of the medians. Both trees need their models built (`make models`) and their `.venv`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.lib.results import format_table, load

ROOT = Path(__file__).resolve().parents[2]
BENCHES = ("model_service", "cache", "feature_service", "pipeline", "mesh", "tracing", "stack")
DEFAULT_BENCHES = BENCHES[:-1]


def run_bench(tree: Path, bench: str, log_dir: Path, tag: str, extra: list[str]) -> dict[str, dict[str, Any]]:
    """One benchmark run in `tree`; its figures (those written during this run) by name."""
    results = tree / "bench" / "results" / "latest.json"
    before = {name: fig.get("time") for name, fig in load(results).items()}
    log = log_dir / f"{bench}-{tag}.log"
    python = tree / ".venv" / "bin" / "python"
    with log.open("w") as out:
        code = subprocess.call(
            [str(python), "-m", f"bench.{bench}", *extra], cwd=tree, stdout=out, stderr=subprocess.STDOUT
        )
    if code != 0:
        print(f"  {bench} in {tree} exited {code}; see {log}", file=sys.stderr)
    # A run lasts longer than the one-second resolution of a figure's time: whatever it wrote has a new time.
    fresh = {name: fig for name, fig in load(results).items() if before.get(name) != fig.get("time")}
    return fresh


def numeric(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path, help="the other tree (a checkout with its own .venv and built models)")
    parser.add_argument("--bench", nargs="+", default=list(DEFAULT_BENCHES), choices=BENCHES)
    parser.add_argument(
        "--bench-args",
        action="append",
        default=[],
        metavar="NAME=ARGS",
        help='extra arguments for one benchmark in both trees, e.g. "stack=--concurrency 8" (repeatable)',
    )
    parser.add_argument("--rounds", type=int, default=2, help="runs per tree and benchmark, alternated")
    parser.add_argument("--logs", type=Path, default=ROOT / "bench" / "results" / "trees_ab")
    args = parser.parse_args()
    old, new = args.old.resolve(), ROOT
    args.logs.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    extras: dict[str, list[str]] = {}
    for item in args.bench_args:
        name, _, rest = item.partition("=")
        extras.setdefault(name, []).extend(shlex.split(rest))
    for bench in args.bench:
        values: dict[str, dict[str, list[float | None]]] = {}
        units: dict[str, str] = {}
        for r in range(args.rounds):
            order = [("old", old), ("new", new)] if r % 2 == 0 else [("new", new), ("old", old)]
            for tag, tree in order:
                print(f"{bench}: round {r + 1}, {tag} tree", flush=True)
                for name, fig in run_bench(tree, bench, args.logs, f"{tag}{r + 1}", extras.get(bench, [])).items():
                    values.setdefault(name, {"old": [], "new": []})[tag].append(numeric(fig.get("value")))
                    units[name] = str(fig.get("unit", ""))
        rows = []
        for name in sorted(values):
            got = values[name]
            olds = [v for v in got["old"] if v is not None]
            news = [v for v in got["new"] if v is not None]
            ratio = (
                statistics.median(news) / statistics.median(olds) if olds and news and statistics.median(olds) else None
            )
            rows.append(
                [
                    name,
                    units[name],
                    " / ".join("-" if v is None else f"{v:.4g}" for v in got["old"]),
                    " / ".join("-" if v is None else f"{v:.4g}" for v in got["new"]),
                    ratio,
                ]
            )
        print(f"\n{bench}: old {old} vs new {new}, {args.rounds} rounds alternated")
        print(format_table(["figure", "unit", "old (per round)", "new (per round)", "new/old (medians)"], rows))
        print(flush=True)


if __name__ == "__main__":
    main()
