"""The house rules a newcomer relies on, checked on the source tree: every service has the same rooms, services
reach each other only through public client modules, and every service module is imported by some test."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"
# The four serving services and the class names their rooms hold.
SHAPED = {"model": "Model", "gateway": "Gateway", "cache": "Cache", "feature": "Feature"}
# What one service may import from another: its public client surface only.
PUBLIC = {"api"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def service_modules() -> list[str]:
    return sorted(
        module_name(p)
        for p in SERVICES.rglob("*.py")
        if "protos" not in p.parts and p.name != "__init__.py" and "__pycache__" not in p.parts
    )


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports (for `from a.b import c`: both a.b and a.b.c, since c may be a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@pytest.mark.parametrize("service", sorted(SHAPED))
def test_every_service_has_the_same_rooms(service: str) -> None:
    name = SHAPED[service]
    rooms = {
        "servicer": f"{name}Servicer",
        "converters": None,
        "handler": f"{name}Handler",
        "settings": f"{name}Settings",
        "__main__": None,
    }
    for room, cls in rooms.items():
        assert (SERVICES / service / f"{room}.py").exists(), f"services/{service}/{room}.py is missing"
        if cls is not None:
            module = importlib.import_module(f"services.{service}.{room}")
            assert hasattr(module, cls), f"services/{service}/{room}.py has no {cls}"


def test_servicers_and_converters_are_the_only_rooms_with_protobuf_in_handlers_signatures() -> None:
    """A handler takes and returns domain types: its module never imports the generated protobuf messages."""
    for service in SHAPED:
        imports = imported_modules(SERVICES / service / "handler.py")
        protos = sorted(m for m in imports if m.startswith("services.protos"))
        assert not protos, f"services/{service}/handler.py imports {protos}; convert in converters.py"


def test_services_use_each_other_only_through_public_client_modules() -> None:
    offenders = []
    for path in SERVICES.rglob("*.py"):
        rel = path.relative_to(SERVICES).parts
        if rel[0] not in SHAPED:
            continue
        for imported in imported_modules(path):
            parts = imported.split(".")
            if len(parts) < 2 or parts[0] != "services" or parts[1] not in SHAPED or parts[1] == rel[0]:
                continue
            if len(parts) == 2 or parts[2] not in PUBLIC:
                offenders.append(f"{path.relative_to(ROOT)} imports {imported}")
    assert not offenders, "\n".join(offenders)


def test_every_service_module_is_imported_by_a_test() -> None:
    imported: set[str] = set()
    for path in (ROOT / "tests").rglob("*.py"):
        imported |= imported_modules(path)
    missing = [m for m in service_modules() if m not in imported]
    assert not missing, "no test imports: " + ", ".join(missing)
