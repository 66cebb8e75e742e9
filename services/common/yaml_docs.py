"""User-written YAML documents validated by pydantic, with errors that name the file, line and field."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from services.common import validation

M = TypeVar("M", bound=BaseModel)
Loc = tuple[int | str, ...]
# A key the schema does not have, in pydantic's own words (which the pipeline and feature-set errors have always
# shown): the line number already points at the key.
UNKNOWN_KEY = "Extra inputs are not permitted"


class DocumentError(ValueError):
    """A YAML document that does not validate; the message reads `file:line: field.path: problem`."""


def node_at(root: yaml.Node | None, loc: Loc) -> yaml.Node | None:
    """The deepest YAML node along a pydantic error location (union tags that are not keys are skipped)."""
    node = root
    for part in loc:
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            for key, value in node.value:
                if key.value == part:
                    node = key if value is None else value
                    break
            else:
                continue  # a discriminator tag or a missing key: stay on the mapping
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
        else:
            continue
    return node


def key_node(root: yaml.Node | None, loc: Loc) -> yaml.Node | None:
    """The key node of the last mapping key along loc (its line is where the offending key is written)."""
    if not loc or not isinstance(loc[-1], str):
        return node_at(root, loc)
    parent = node_at(root, loc[:-1])
    if isinstance(parent, yaml.MappingNode):
        for key, _value in parent.value:
            if key.value == loc[-1]:
                return key
    return parent


def document_path(loc: Loc, union_tags: Collection[str] = ()) -> str:
    """`features[7].window` from a pydantic location: indexes as `[i]` on their list, union tags that pydantic puts
    after an index skipped, the rest joined by `validation.field_path` (`<root>` for the document itself)."""
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int) and parts:
            parts[-1] += f"[{part}]"
        elif isinstance(part, int):
            parts.append(f"[{part}]")
        elif not (parts and parts[-1].endswith("]") and part in union_tags):
            parts.append(part)
    return validation.field_path(parts)


def located_error(
    path: Path,
    root: yaml.Node | None,
    loc: Loc,
    message: str,
    error: type[DocumentError] = DocumentError,
    union_tags: Collection[str] = (),
) -> DocumentError:
    node = key_node(root, loc)
    line = node.start_mark.line + 1 if node is not None else 1
    return error(f"{path}:{line}: {document_path(loc, union_tags)}: {message}")


def parse_yaml(path: Path, error: type[DocumentError] = DocumentError) -> tuple[Any, yaml.Node | None]:
    """(data, node tree) of a YAML file; a syntax error names the file and line."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc}") from exc
    try:
        return yaml.safe_load(text), yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise error(f"{path}:{line}: (yaml): {exc}") from exc


def invalid_document(
    path: Path,
    root: yaml.Node | None,
    exc: ValidationError,
    error: type[DocumentError] = DocumentError,
    union_tags: Collection[str] = (),
) -> DocumentError:
    """The first problem of a validation error (as `validation.problems` words it) at its file and line."""
    loc, message = validation.problems(exc, UNKNOWN_KEY)[0]
    return located_error(path, root, loc, message, error, union_tags)


def load_document(
    path: Path, model: type[M], error: type[DocumentError] = DocumentError, union_tags: Collection[str] = ()
) -> tuple[M, yaml.Node | None]:
    """Parse and validate one YAML document as `model`; the first problem is raised with its location."""
    data, root = parse_yaml(path, error)
    try:
        return model.model_validate(data), root
    except ValidationError as exc:
        raise invalid_document(path, root, exc, error, union_tags) from exc
