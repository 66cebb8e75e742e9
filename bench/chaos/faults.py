"""The faults the chaos run injects into a running `meshserve up`: signals to its processes (pids read from
`<log-dir>/stack.json` at the moment of the fault, since a restart changes them), a model version copied into its
model repository for the watcher to hot-load, and the mesh's canary weights changed as `meshserve canary` does."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

STATE_FILE = "stack.json"
VALKEY = "valkey"


class FaultError(RuntimeError):
    """A fault that could not be injected (no such process, nothing to copy); the message says which."""


def read_state(log_dir: Path) -> dict[str, Any]:
    return json.loads((log_dir / STATE_FILE).read_text())


def service_pids(state: dict[str, Any]) -> dict[str, int]:
    """Name -> pid of every process stack.json lists."""
    return {s["name"]: int(s["pid"]) for s in state.get("services", []) if s.get("pid")}


def pick(names: list[str], prefix: str, nth: int = 0) -> str:
    """The `nth` process name (sorted) that is `prefix` or starts with `prefix-`."""
    found = sorted(n for n in names if n == prefix or n.startswith(prefix + "-"))
    if len(found) <= nth:
        raise FaultError(f"no process #{nth + 1} named {prefix}* in {sorted(names)}")
    return found[nth]


def children(parent: int, proc: Path = Path("/proc")) -> dict[int, str]:
    """Pid -> command name of `parent`'s children (Linux /proc)."""
    out = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == parent and fields[0] != "Z":  # fields[0]: state, fields[1]: ppid
            out[int(entry.name)] = comm
    return out


def valkey_pid(log_dir: Path, supervisor_pid: int) -> int:
    """Valkey's pid: its stack.json row where `meshserve up` supervises it, else the valkey-server it runs as its
    own child."""
    pids = service_pids(read_state(log_dir))
    if VALKEY in pids:
        return pids[VALKEY]
    for pid, comm in children(supervisor_pid).items():
        if comm.startswith("valkey"):
            return pid
    raise FaultError(f"no valkey process under pid {supervisor_pid}")


def pid_of(log_dir: Path, prefix: str, nth: int = 0) -> tuple[str, int]:
    """The name and current pid of the `nth` process named `prefix`*."""
    pids = service_pids(read_state(log_dir))
    name = pick(list(pids), prefix, nth)
    return name, pids[name]


def send(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        raise FaultError(f"pid {pid} is gone") from None


def next_version(model_dir: Path) -> int:
    """One past the highest numbered version folder of a model."""
    versions = [int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    return max(versions, default=0) + 1


def hot_load(models_dir: Path, model: str, source_version: int) -> int:
    """Copy `source_version` of `model` as its next version, so the repository watcher loads it; the new number.

    The copy is made beside the repository's models in a hidden folder (the watcher ignores those) and renamed into
    place, so the watcher never sees half a version."""
    model_dir = models_dir / model
    source = model_dir / str(source_version)
    if not source.is_dir():
        raise FaultError(f"{source} is not a version folder")
    version = next_version(model_dir)
    staging = Path(tempfile.mkdtemp(prefix=".chaos-", dir=models_dir))
    try:
        shutil.copytree(source, staging / "v")
        (staging / "v").rename(model_dir / str(version))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return version


def set_canary(log_dir: Path, canary_percent: int | None) -> tuple[dict[str, int], bool]:
    """Set the model route's split to `canary_percent` to v2 (None: roll back to v1), as `meshserve canary` does,
    once Envoy serves it; the split in force and whether it changed (a split already in force is left alone)."""
    from services.cli.canary import CanaryError, change

    wanted = {"v1": 100, "v2": 0} if canary_percent is None else {"v1": 100 - canary_percent, "v2": canary_percent}
    try:
        current = change(log_dir, "model")
        if current == wanted:
            return current, False
        return change(log_dir, "model", weights=wanted), True
    except (CanaryError, TimeoutError) as e:  # what `meshserve canary` reports as its failure
        raise FaultError(f"canary: {e}") from None
