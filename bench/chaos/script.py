"""The chaos run's script: the faults it injects at each level, in order, and how long each part of the run lasts."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.chaos import faults
from bench.chaos.load import OpenLoop
from bench.chaos.phases import FAULT, OVERLOAD

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
    Step("kill valkey", kill_valkey, causes=("features_",)),
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
