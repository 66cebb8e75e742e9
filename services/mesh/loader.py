"""Reads Istio YAML files into typed resources; an unsupported kind or field is a MeshConfigError naming both."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from services.common.validation import describe
from services.mesh.errors import MeshConfigError
from services.mesh.istio import (
    KINDS,
    AuthorizationPolicy,
    DestinationRule,
    EnvoyFilter,
    Gateway,
    PeerAuthentication,
    RequestAuthentication,
    Resource,
    ServiceEntry,
    Telemetry,
    VirtualService,
)

SKIPPED_KINDS = {"Component", "Kustomization"}  # kustomize files that sit next to the resources
UNSUPPORTED_FIELD = "field not supported by the local mesh"


@dataclass
class IstioConfig:
    """Every resource read, by kind; a later file replaces an earlier resource of the same kind and name."""

    resources: dict[tuple[str, str], Resource] = field(default_factory=dict)

    def of(self, kind: type[Resource]) -> list[Any]:
        return [r for (k, _), r in self.resources.items() if k == kind.__name__]

    @property
    def virtual_services(self) -> list[VirtualService]:
        return self.of(VirtualService)

    @property
    def destination_rules(self) -> list[DestinationRule]:
        return self.of(DestinationRule)

    @property
    def gateways(self) -> list[Gateway]:
        return self.of(Gateway)

    @property
    def telemetries(self) -> list[Telemetry]:
        return self.of(Telemetry)

    @property
    def peer_authentications(self) -> list[PeerAuthentication]:
        return self.of(PeerAuthentication)

    @property
    def authorization_policies(self) -> list[AuthorizationPolicy]:
        return self.of(AuthorizationPolicy)

    @property
    def request_authentications(self) -> list[RequestAuthentication]:
        return self.of(RequestAuthentication)

    @property
    def envoy_filters(self) -> list[EnvoyFilter]:
        return self.of(EnvoyFilter)

    @property
    def service_entries(self) -> list[ServiceEntry]:
        return self.of(ServiceEntry)


def parse_resource(doc: dict[str, Any], source: Path) -> Resource:
    """One YAML document as a typed resource, or MeshConfigError naming the file, resource and field."""
    kind = doc.get("kind")
    name = (doc.get("metadata") or {}).get("name", "?")
    model = KINDS.get(str(kind))
    if model is None:
        supported = ", ".join(sorted(KINDS))
        raise MeshConfigError(f"{source}: kind {kind!r} ('{name}') is not supported by the local mesh ({supported})")
    try:
        resource = model.model_validate(doc)
    except ValidationError as exc:
        raise MeshConfigError(f"{source}: {kind} '{name}': {describe(exc, unknown_field=UNSUPPORTED_FIELD)}") from None
    resource.source = source
    return resource


def files_of(paths: Sequence[Path]) -> list[Path]:
    """The YAML files named, and those directly inside the folders named (not sub-folders such as variants/)."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            out.extend(sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file()))
        elif path.is_file():
            out.append(path)
        else:
            raise MeshConfigError(f"{path}: no such file or folder")
    return out


def load_istio(paths: Sequence[Path | str]) -> IstioConfig:
    """Read the folders/files in order; a variant file listed after `istio/` replaces resources of the same name."""
    config = IstioConfig()
    for file in files_of([Path(p) for p in paths]):
        try:
            docs = list(yaml.safe_load_all(file.read_text()))
        except yaml.YAMLError as exc:
            raise MeshConfigError(f"{file}: not valid YAML: {exc}") from None
        for doc in docs:
            if not doc:
                continue
            if not isinstance(doc, dict):
                raise MeshConfigError(f"{file}: a document is not a mapping")
            if doc.get("kind") in SKIPPED_KINDS:
                continue
            resource = parse_resource(doc, file)
            config.resources[(resource.kind, resource.metadata.name)] = resource
    return config
