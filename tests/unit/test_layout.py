"""The house rules a newcomer relies on, checked on the source tree: every service has the same rooms, services
reach each other only through public client modules, and every service module is imported by some test."""

from __future__ import annotations

import ast
import functools
import importlib
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"
# The four serving services, the scaler beside the gateways, and the class names their rooms hold.
SHAPED = {"model": "Model", "gateway": "Gateway", "cache": "Cache", "feature": "Feature", "scaler": "Scaler"}
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


# Gateway modules that may import the generated protobuf modules: the servicer and its converters, the cached
# form of an answer (its bytes are a serialized ModelInferResponse that every gateway replica reads, see
# services/gateway/cache_converters.py), forwarding (v2 messages passed through unchanged), the clients of the
# other services (upstream) and `__main__`, which registers the servicer with the server.
GATEWAY_PROTOBUF_ROOMS = {"servicer", "converters", "cache_converters", "forwarding", "upstream", "__main__"}


def test_no_gateway_module_below_the_servicer_imports_protobuf() -> None:
    offenders = []
    for path in sorted((SERVICES / "gateway").rglob("*.py")):
        if path.stem in GATEWAY_PROTOBUF_ROOMS:
            continue
        protos = sorted(m for m in imported_modules(path) if m.startswith("services.protos"))
        if protos:
            offenders.append(f"{path.relative_to(ROOT)} imports {protos}")
    assert not offenders, "\n".join(offenders) + "\nconvert in converters.py and hand domain types on"


# A comment or docstring says why, in words: a dated measurement belongs in bench/README.md (with a pointer left
# in the code where the reason matters), and an issue number is something a reader of the repository cannot open.
DATED = re.compile(r"\b20\d\d-\d\d-\d\d\b")
ISSUE = re.compile(r"\bissue\s*#?\d+", re.IGNORECASE)


def comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and of every module, class and function docstring of a file."""
    source = path.read_text()
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                found.append((node.body[0].lineno, docstring))
    return found


def test_no_dated_figure_and_no_issue_number_in_a_comment() -> None:
    offenders = []
    for path in sorted(SERVICES.rglob("*.py")):
        if "protos" in path.parts:
            continue
        for line, text in comments_and_docstrings(path):
            for pattern in (DATED, ISSUE):
                match = pattern.search(text)
                if match:
                    at = line + text[: match.start()].count("\n")
                    offenders.append(f"{path.relative_to(ROOT)}:{at}: {match.group()!r}")
    assert not offenders, "\n".join(offenders)


# A function longer than this (from its `def` line to its last line; decorators not counted) is split into named
# steps, unless its docstring says why it is not, with these words: "Long because ...".
MAX_FUNCTION_LINES = 60
LONG_BECAUSE = "Long because"


def test_no_function_is_longer_than_60_lines_unless_its_docstring_says_why() -> None:
    offenders = []
    for path in sorted(SERVICES.rglob("*.py")):
        if "protos" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_FUNCTION_LINES and LONG_BECAUSE not in (ast.get_docstring(node) or ""):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name} has {lines} lines")
    assert not offenders, "\n".join(offenders)


# A service's api.py is its public surface: a list of re-exports (imports and `__all__`, nothing defined there), the
# client class behind it in client.py. Every shaped service keeps its domain types in domain.py, and its __main__.py
# has one `build(settings)` that returns the server and its handler, which `serve` runs and `main` calls.
API_STATEMENTS = (ast.Import, ast.ImportFrom)
MAINS = [*sorted(SHAPED), "traces"]


def api_modules() -> list[Path]:
    return sorted(p for p in SERVICES.rglob("api.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", api_modules(), ids=lambda p: str(p.relative_to(SERVICES)))
def test_an_api_module_only_re_exports(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    body = tree.body[1:] if ast.get_docstring(tree) is not None else tree.body
    imported: set[str] = set()
    exported: list[str] | None = None
    for node in body:
        if isinstance(node, API_STATEMENTS):
            if not (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
                imported |= {alias.asname or alias.name for alias in node.names}
        elif (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == ["__all__"]
            and isinstance(node.value, ast.List | ast.Tuple)
        ):
            exported = [ast.literal_eval(e) for e in node.value.elts]
        else:
            raise AssertionError(f"{path.relative_to(ROOT)}:{node.lineno}: an api module only imports and lists")
    assert exported is not None, f"{path.relative_to(ROOT)} has no __all__"
    assert set(exported) == imported, f"{path.relative_to(ROOT)}: __all__ must list exactly what it imports"
    service = path.parent.name
    client = SERVICES / service / "client.py"
    assert client.exists(), f"services/{service}/client.py is missing: the client class lives there"
    assert f"services.{service}.client" in imported_modules(path), f"{path.relative_to(ROOT)} re-exports no client"


@pytest.mark.parametrize("service", sorted(SHAPED))
def test_every_service_keeps_its_domain_types_in_domain_py(service: str) -> None:
    assert (SERVICES / service / "domain.py").exists(), f"services/{service}/domain.py is missing"


def top_level_functions(path: Path) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text(), str(path))
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def calls(node: ast.AST) -> set[str]:
    """The names of the functions a function calls by name (`f(...)`; for `a.f(...)`, f)."""
    found = set()
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            func = call.func
            found.add(func.id if isinstance(func, ast.Name) else getattr(func, "attr", ""))
    return found


@pytest.mark.parametrize("service", MAINS)
def test_every_main_builds_with_one_build_function(service: str) -> None:
    functions = top_level_functions(SERVICES / service / "__main__.py")
    where = f"services/{service}/__main__.py"
    build, serve, main = (functions.get(name) for name in ("build", "serve", "main"))
    assert isinstance(build, ast.FunctionDef), f"{where} has no build(settings)"
    assert [a.arg for a in build.args.args] == ["settings"], f"{where}: build takes the settings alone"
    assert isinstance(serve, ast.AsyncFunctionDef) and "build" in calls(serve), f"{where}: serve does not build"
    assert main is not None and "serve" in calls(main), f"{where}: main does not serve"
    assert not {"build", "GrpcService"} & calls(main), f"{where}: main reads settings and serves; build wires"


# ----------------------------------------------------------------------------- test folders and their processes
# make test runs three pytest processes: tests/unit (in process) with tests/manifests; tests/integration and
# tests/fuzz (real processes driven through services.protos); tests/compat and tests/mesh (real processes driven by
# tritonclient). tritonclient registers protobuf package `inference` in the default descriptor pool, and so do the
# generated modules of services.protos built from a .proto in that package: one process cannot hold both.
PROJECT_PACKAGES = ("services", "bench", "models", "tests", "tools")
STUB_FOLDERS = ("tests/unit", "tests/integration", "tests/fuzz")
CLIENT_FOLDERS = ("tests/compat", "tests/mesh")


def module_source(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


@functools.cache
def imports_of(path: Path) -> frozenset[str]:
    return frozenset(imported_modules(path))


def reached_modules(path: Path) -> set[str]:
    """Every module a file imports, directly or through the modules of this repository it imports (and their
    packages), at any depth; imports inside functions count, since a test may call them."""
    reached: set[str] = set()
    todo = sorted(imports_of(path))
    while todo:
        module = todo.pop()
        if module in reached:
            continue
        reached.add(module)
        parts = module.split(".")
        if parts[0] in PROJECT_PACKAGES:
            todo += [".".join(parts[:i]) for i in range(1, len(parts))]
            source = module_source(module)
            if source is not None:
                todo += sorted(imports_of(source))
    return reached


def inference_package_stubs() -> set[str]:
    """The generated modules of services.protos whose .proto declares (or imports one that declares) package
    `inference`, the package tritonclient brings its own copy of."""
    protos = {p.stem: p.read_text() for p in (ROOT / "protos").glob("*.proto")}
    clashing = {name for name, text in protos.items() if re.search(r"^package inference;", text, re.M)}
    grown = True
    while grown:
        importers = {n for n, text in protos.items() if any(f'import "{c}.proto";' in text for c in clashing)}
        grown = not importers <= clashing
        clashing |= importers
    return {f"services.protos.{name}{suffix}" for name in clashing for suffix in ("_pb2", "_pb2_grpc")}


def files_under(folders: tuple[str, ...]) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def test_no_test_of_the_stub_processes_imports_tritonclient() -> None:
    """tests/unit, tests/integration and tests/fuzz drive the services through services.protos; a test that needs
    tritonclient belongs in tests/compat."""
    offenders = [
        f"{path.relative_to(ROOT)}: {', '.join(sorted(found))}"
        for path in files_under(STUB_FOLDERS)
        if (found := {m for m in reached_modules(path) if m.split(".")[0] == "tritonclient"})
    ]
    assert not offenders, "move to tests/compat (tritonclient):\n" + "\n".join(offenders)


def test_no_test_of_the_tritonclient_process_imports_the_inference_stubs() -> None:
    """tests/compat and tests/mesh run beside tritonclient, so they never import services.protos's modules of
    protobuf package `inference` (inference_pb2, model_config_pb2 and their _grpc). The other generated modules
    are in packages of their own (meshserve.cache, meshserve.feature) and sit beside tritonclient: tests/compat
    uses them to reach the cache and feature services directly (test_cli.py, test_gateway_pipeline.py)."""
    stubs = inference_package_stubs()
    assert "services.protos.inference_pb2" in stubs
    offenders = [
        f"{path.relative_to(ROOT)}: {', '.join(sorted(found))}"
        for path in files_under(CLIENT_FOLDERS)
        if (found := reached_modules(path) & stubs)
    ]
    assert not offenders, "move to tests/integration (services.protos' inference package):\n" + "\n".join(offenders)


def test_no_service_module_shadows_the_standard_library() -> None:
    """A module named like a standard-library one (`operator`, `statistics`, `token`) shadows it for anything run
    from its folder and misleads a reader of `import statistics`; give it a name of its own."""
    import sys

    shadowing = sorted(
        str(p.relative_to(ROOT))
        for p in SERVICES.rglob("*")
        if "__pycache__" not in p.parts
        and (
            (p.suffix == ".py" and p.stem in sys.stdlib_module_names)
            or (p.is_dir() and p.name in sys.stdlib_module_names)
        )
    )
    assert not shadowing, "modules named like standard-library modules: " + ", ".join(shadowing)
