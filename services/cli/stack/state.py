"""Where the running local stack is found from any working directory: its log dir (by default one fixed folder) and
the stack.json `meshserve up` keeps there."""

from __future__ import annotations

import json
import os
from pathlib import Path

STATE_FILE = "stack.json"
LOG_DIR_NAME = ".logs"
CHECKOUT = Path(__file__).resolve().parents[3]


def default_log_dir() -> Path:
    """The log dir of `meshserve up` and every command when none is given, an absolute path: `.logs` in the
    repository checkout meshserve runs from (where `make run` puts it), or for an installed package
    `$XDG_STATE_HOME/meshserve` (default `~/.local/state/meshserve`)."""
    if (CHECKOUT / "pyproject.toml").is_file() and (CHECKOUT / "services" / "cli").is_dir():
        return CHECKOUT / LOG_DIR_NAME
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "meshserve"


def read_state(log_dir: Path) -> dict | None:
    """The running stack's stack.json in `log_dir`, or None when there is none (or it is half written)."""
    try:
        data = json.loads((log_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def stack_address(log_dir: Path | None, fallback: str) -> str:
    """Where clients call the stack of `log_dir`: its ingress, or its gateway without the mesh, as its stack.json
    says; `fallback` when no stack runs there."""
    state = read_state(log_dir) if log_dir is not None else None
    if state is None:
        return fallback
    return str(state.get("ingress") or state.get("gateway") or fallback)


def entry_dir(log_dir: Path) -> Path:
    """The folder of the stack clients call in `log_dir`: the edge tier's when two tiers run there (`meshserve up
    --topology edge_cloud`; its secrets sign the clients' tokens), else `log_dir` itself."""
    tiers = (read_state(log_dir) or {}).get("tiers")
    edge = tiers.get("edge") if isinstance(tiers, dict) else None
    return Path(edge) if isinstance(edge, str) else log_dir
