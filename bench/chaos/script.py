"""The chaos run's script: the faults it injects at each level, in order, and how long each part of the run lasts."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.chaos import faults
from bench.chaos.feature_state import StoreCheck, StoreVerdict
from bench.chaos.load import OpenLoop
from bench.chaos.phases import FAULT, OVERLOAD, WIPE

MODEL = "fraud_mlp"
HOT_SOURCE_VERSION = 2  # copied as the next version: the canary replica serves it


@dataclass
class Durations:
    """Seconds of each part of the run (flags; --quick shortens them)."""

    settle: float = 3.0  # at a new level's rate before its quiet phase
    quiet: float = 20.0
    lead: float = 3.0  # base load before a fault
    tail: float = 17.0  # base load after a fault ends
    stop: float = 10.0  # how long a SIGSTOPped process stays stopped
    store_check: float = 4.0  # Ingest load on after Valkey's SIGKILL; how long after a FLUSHALL rows are read
    canary: float = 10.0  # each canary step: its whole phase
    overload: float = 30.0
    ramp_step: float = 8.0
    warmup: float = 5.0
    recovery_window: float = 2.0  # recovery compares windows this long with the quiet phase ...
    recovery_hold: float = 4.0  # ... and needs this long of them in a row back to it


QUICK = Durations(
    settle=2.0,
    quiet=6.0,
    lead=1.0,
    tail=6.0,
    stop=4.0,
    store_check=3.0,
    canary=5.0,
    overload=8.0,
    ramp_step=2.5,
    warmup=3.0,
    recovery_window=1.0,
    recovery_hold=2.0,
)


@dataclass
class Context:
    """What the script's faults act on."""

    log_dir: Path
    supervisor_pid: int
    models_dir: Path
    load: OpenLoop
    base_rate: float = 0.0
    overload_rate: float = 0.0
    stopped: set[int] = field(default_factory=set)  # SIGSTOPped pids, continued whatever happens
    phase_key: str = ""  # "<level>/<step>" of the phase running (run.phase sets it)
    store: StoreCheck | None = None  # the feature store's check of the phase running, between its begin and end
    verdicts: dict[str, tuple[StoreVerdict, bool]] = field(default_factory=dict)  # phase key -> (verdict, wiped)


Action = Callable[[Context], Awaitable[str]]


@dataclass(frozen=True)
class Step:
    """One scripted phase: its fault (begin, and end after `hold` seconds), the degradation it may cause."""

    name: str
    begin: Action
    end: Action | None = None
    hold: str = ""  # the Durations field that holds the fault (empty: a single event)
    causes: tuple[str, ...] = ()
    kind: str = FAULT
    length: str = ""  # the Durations field for the whole phase, instead of lead + hold + tail


def kill(prefix: str, nth: int = 0) -> Action:
    async def act(ctx: Context) -> str:
        name, pid = faults.pid_of(ctx.log_dir, prefix, nth)
        faults.send(pid, signal.SIGKILL)
        return f"SIGKILL {name} (pid {pid})"

    return act


def stop(prefix: str, nth: int = 0) -> tuple[Action, Action]:
    held: list[tuple[str, int]] = []

    async def begin(ctx: Context) -> str:
        name, pid = faults.pid_of(ctx.log_dir, prefix, nth)
        faults.send(pid, signal.SIGSTOP)
        ctx.stopped.add(pid)
        held.append((name, pid))
        return f"SIGSTOP {name} (pid {pid})"

    async def end(ctx: Context) -> str:
        name, pid = held.pop()
        ctx.stopped.discard(pid)
        faults.send(pid, signal.SIGCONT)
        return f"SIGCONT {name}"

    return begin, end


async def kill_valkey(ctx: Context) -> str:
    pid = faults.valkey_pid(ctx.log_dir, ctx.supervisor_pid)
    faults.send(pid, signal.SIGKILL)
    return f"SIGKILL valkey (pid {pid})"


async def _store_step(ctx: Context, wiped: bool) -> str:
    """Begin a feature-store check: Ingest load, then the SIGKILL (or events, then a FLUSHALL)."""
    try:
        ctx.store = StoreCheck(ctx.log_dir, f"{ctx.phase_key.replace('/', '-').replace('%', '')}-{time.time():.0f}")
    except (OSError, KeyError, ValueError) as e:
        ctx.verdicts[ctx.phase_key] = (StoreVerdict(error=f"no probe: {e}"), wiped)
        raise faults.FaultError(f"feature store probe: {e}") from None
    try:
        return await (ctx.store.flush() if wiped else ctx.store.kill_under_ingest(lambda: kill_valkey(ctx)))
    except (faults.FaultError, OSError) as e:
        await ctx.store.run.finish()
        await ctx.store.close()
        ctx.verdicts[ctx.phase_key], ctx.store = (StoreVerdict(error=str(e)), wiped), None
        raise faults.FaultError(str(e)) from None


async def _store_verdict(ctx: Context, wiped: bool) -> str:
    """End a feature-store check: read the store back and judge it (run.py adds its checks to the phase)."""
    store, ctx.store = ctx.store, None
    if store is None:
        return "store not checked"
    try:
        verdict = await (store.after_flush() if wiped else store.after_kill())
    finally:
        await store.close()
    ctx.verdicts[ctx.phase_key] = (verdict, wiped)
    return verdict.describe(wiped)


async def kill_valkey_under_ingest(ctx: Context) -> str:
    return await _store_step(ctx, wiped=False)


async def store_after_kill(ctx: Context) -> str:
    return await _store_verdict(ctx, wiped=False)


async def flush_valkey(ctx: Context) -> str:
    return await _store_step(ctx, wiped=True)


async def store_after_flush(ctx: Context) -> str:
    return await _store_verdict(ctx, wiped=True)


async def hot_load(ctx: Context) -> str:
    version = await asyncio.to_thread(faults.hot_load, ctx.models_dir, MODEL, HOT_SOURCE_VERSION)
    return f"copied {MODEL}/{HOT_SOURCE_VERSION} as {MODEL}/{version}"


def canary(percent: int | None) -> Action:
    async def act(ctx: Context) -> str:
        split, changed = await asyncio.to_thread(faults.set_canary, ctx.log_dir, percent)
        return ("" if changed else "already ") + ", ".join(f"{k} {v}%" for k, v in split.items())

    return act


async def overload(ctx: Context) -> str:
    ctx.load.set_rate(ctx.overload_rate)
    return f"{ctx.overload_rate:.0f} req/s"


async def back_to_base(ctx: Context) -> str:
    ctx.load.set_rate(ctx.base_rate)
    return f"back to {ctx.base_rate:.0f} req/s"


_stop_model, _cont_model = stop("model-v1", 1)
_stop_feature, _cont_feature = stop("feature")
# A stalled model replica holds its calls until the pipeline's model budget: the remedies (fallback model, stale
# cache, default) answer them, marked. Valkey and the feature service hold the features. The other faults are
# masked by retries across replicas (model, gateway), a cache that misses fast, or atomic switches.
SCRIPT = [
    Step("kill model replica", kill("model-v1", 0)),
    Step("stop model replica", _stop_model, _cont_model, hold="stop", causes=("model_",)),
    # Ingest load through the kill: every acknowledged event must be in the aggregates after the restart.
    Step("kill valkey", kill_valkey_under_ingest, store_after_kill, hold="store_check", causes=("features_",)),
    Step("stop feature", _stop_feature, _cont_feature, hold="stop", causes=("features_",)),
    Step("kill cache", kill("cache")),
    Step("kill gateway", kill("gateway")),
    Step("hot-load version", hot_load),
    Step("canary 10%", canary(10), length="canary"),
    Step("canary 50%", canary(50), length="canary"),
    Step("canary 100%", canary(100), length="canary"),
    Step("canary rollback", canary(None), length="canary"),
    Step("overload 3x", overload, back_to_base, hold="overload", kind=OVERLOAD),
]

# Once, after every level: a store wiped on purpose marks every answer that reads it (features_store_reset) until
# its longest window has passed, so nothing may come after it.
FINAL = [Step("flushall valkey", flush_valkey, store_after_flush, hold="store_check", causes=("features_",), kind=WIPE)]
