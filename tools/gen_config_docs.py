"""Generate docs/configuration.md from the settings classes: every pydantic-settings class under services/.

The classes are found by walking services/ (a module defining a class whose base is named `...Settings` is
imported, and its BaseSettings subclasses are read), so a new or moved settings class appears without a change
here. Each environment variable comes with its type, default and the field's description.

`--check` generates in memory and fails (exit 1) when docs/configuration.md differs (stale).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import sys
import tempfile
import types
import typing
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ROOT / "services"
OUT = ROOT / "docs" / "configuration.md"
SKIP_DIRS = {"protos", "__pycache__"}

HEADER = """\
<!-- Generated from the settings classes by tools/gen_config_docs.py; do not edit. `make lint` fails when it is
stale: run `.venv/bin/python tools/gen_config_docs.py`. -->
# Configuration

Every setting of a process comes from its environment. Each service reads `MESHSERVE_<NAME>_*` through its
settings class (a pydantic-settings `BaseSettings`), where every field carries the description below; the tables
are generated from those classes, so they list every variable with its type and default. Shared variables:
`MESHSERVE_REDIS_URL` (cache and feature, each given its own Redis), `MESHSERVE_TRACING_*` (every process) and the
standard OpenTelemetry ones: `OTEL_EXPORTER_OTLP_ENDPOINT` (tracing is off without it), `OTEL_TRACES_SAMPLER` and
`OTEL_TRACES_SAMPLER_ARG` (head sampling only), `OTEL_SDK_DISABLED`.

Values are read as pydantic-settings reads them: JSON for lists and dicts (`MESHSERVE_MODEL_MODELS='["fraud_mlp"]'`),
plain text otherwise; booleans as `true`/`false` (or `1`/`0`). What a service serves is described in YAML, not in
the environment: pipelines ([gateway.md](gateway.md#a-pipeline)), feature sets
([feature.md](feature.md#a-feature-set)) and model configs ([model.md](model.md#a-model)). `meshserve up` sets
these variables for every process it starts ([local-stack.md](local-stack.md)); in Kubernetes the Deployments do
([kubernetes.md](kubernetes.md)).
"""


def candidate_modules(root: Path = SERVICES) -> list[str]:
    """Dotted names of the modules under `root` that define a class whose base's name ends with `Settings`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if SKIP_DIRS & set(path.relative_to(root).parts):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(_base_name(b).endswith("Settings") for b in node.bases):
                found.append(".".join(path.relative_to(ROOT).with_suffix("").parts))
                break
    return found


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def settings_classes(modules: list[str]) -> list[type]:
    """The BaseSettings subclasses defined in `modules` that no other of them subclasses (the ones processes read),
    with at least one field; ordered by module, then class name."""
    from pydantic_settings import BaseSettings

    classes: list[type] = []
    for name in modules:
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, BaseSettings) and obj.__module__ == name:
                classes.append(obj)
    bases = {base for cls in classes for base in cls.__mro__[1:]}
    leaves = [c for c in classes if c not in bases and c.model_fields]  # type: ignore[attr-defined]
    return sorted(leaves, key=lambda c: (c.__module__, c.__name__))


def env_name(cls: Any, field: str) -> str:
    """The environment variable `cls` reads `field` from: its alias (the first one), else env_prefix + name."""
    from pydantic import AliasChoices

    info = cls.model_fields[field]
    alias = info.validation_alias or info.alias
    if isinstance(alias, AliasChoices):
        alias = next((choice for choice in alias.choices if isinstance(choice, str)), None)
    if isinstance(alias, str):
        return alias.upper()
    return f"{cls.model_config.get('env_prefix', '')}{field}".upper()


def type_name(annotation: Any) -> str:
    """A reader's name for a field's type: `int`, `path`, `list[str]`, `auto \\| head`, `int or unset`."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        name = " or ".join(type_name(a) for a in rest)
        return f"{name} or unset" if len(rest) < len(args) else name
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (list, dict, set, tuple):
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    if isinstance(annotation, type):
        if issubclass(annotation, Path):
            return "path"
        if annotation.__name__ == "SecretStr":
            return "secret"
        if issubclass(annotation, Enum):
            return " \\| ".join(f"`{m.value}`" for m in annotation)
        return annotation.__name__
    return str(annotation)


def bounds(metadata: list[Any]) -> str:
    """The field's numeric constraints, e.g. `0..65535`, `≥ 1`, `> 0`."""
    low = high = ""
    for item in metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">")):
            if getattr(item, attr, None) is not None:
                low = f"{sign} {_number(getattr(item, attr))}"
        for attr, sign in (("le", "≤"), ("lt", "<")):
            if getattr(item, attr, None) is not None:
                high = f"{sign} {_number(getattr(item, attr))}"
    if low.startswith("≥") and high.startswith("≤"):
        return f"{low[2:]}..{high[2:]}"
    return ", ".join(p for p in (low, high) if p)


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def default_text(info: Any) -> str:
    """The default as it would be written in the environment; paths relative to the repository."""
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if hasattr(value, "get_secret_value"):
        value = value.get_secret_value()
    if isinstance(value, Path):
        return f"`{_path_text(value)}`"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int | float):
        return f"`{_number(value)}`"
    if isinstance(value, str):
        return f"`{value}`" if value else "empty"
    return f"`{json.dumps(value)}`"


def _path_text(path: Path) -> str:
    if path.is_absolute():
        if path.is_relative_to(ROOT):
            return path.relative_to(ROOT).as_posix() or "."
        temp = Path(tempfile.gettempdir())
        if path.is_relative_to(temp):
            return f"<tempdir>/{path.relative_to(temp).as_posix()}"
    return path.as_posix()


def _cell(text: str) -> str:
    """Text for a table cell: one line, pipes escaped, and `<...>` outside code spans kept visible (not HTML)."""
    parts = " ".join(text.split()).replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):  # even parts lie outside code spans
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def section(cls: Any) -> Iterator[str]:
    """One class's heading, origin and table of variables."""
    prefix = cls.model_config.get("env_prefix", "")
    module_path = Path(*cls.__module__.split(".")).with_suffix(".py").as_posix()
    doc = (cls.__doc__ or "").strip().split("\n\n")[0]
    yield f"## `{prefix}*`: {cls.__name__}"
    yield ""
    yield f"`{cls.__name__}` in `{module_path}`. {_cell(doc)}" if doc else f"`{cls.__name__}` in `{module_path}`."
    yield ""
    yield "| variable | type | default | meaning |"
    yield "| --- | --- | --- | --- |"
    for field, info in cls.model_fields.items():
        kind = type_name(info.annotation)
        limits = bounds(info.metadata)
        kind = f"{kind}, {limits}" if limits else kind
        meaning = _cell(info.description or "")
        yield f"| `{env_name(cls, field)}` | {kind} | {default_text(info)} | {meaning} |"
    yield ""


def render() -> str:
    """The whole page."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    classes = settings_classes(candidate_modules())
    lines = [HEADER]
    lines.append("Contents: " + " · ".join(f"[{c.__name__}](#{_anchor(c)})" for c in classes))
    lines.append("")
    for cls in classes:
        lines.extend(section(cls))
    return "\n".join(lines).rstrip("\n") + "\n"


def _anchor(cls: Any) -> str:
    """GitHub's anchor of a section heading: lower case, punctuation dropped, spaces to dashes."""
    title = f"{cls.model_config.get('env_prefix', '')}*: {cls.__name__}".lower()
    return "".join(ch for ch in title if ch.isalnum() or ch in "-_ ").replace(" ", "-")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if docs/configuration.md is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        current = OUT.read_text() if OUT.exists() else ""
        if current != text:
            print(
                f"{OUT.relative_to(ROOT)} is stale (the settings classes changed); "
                "run `.venv/bin/python tools/gen_config_docs.py`"
            )
            return 1
        print(f"{OUT.relative_to(ROOT)} is up to date")
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
