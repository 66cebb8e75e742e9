"""YAML documents validated by pydantic: every error names the file, the line and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.common.yaml_docs import (
    DocumentError,
    document_path,
    invalid_document,
    load_document,
    located_error,
    parse_yaml,
)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Count(Strict):
    kind: Literal["count"]
    window: int


class Last(Strict):
    kind: Literal["last"]
    field: str


class Doc(Strict):
    name: str
    features: list[Annotated[Count | Last, Field(discriminator="kind")]]


class DocError(DocumentError):
    """A document type of a caller's own."""


GOOD = """\
name: toy
features:
  - kind: count
    window: 60
  - kind: last
    field: amount
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "toy.yaml"
    path.write_text(text)
    return path


def test_a_good_document_and_its_node_tree(tmp_path: Path) -> None:
    doc, root = load_document(write(tmp_path, GOOD), Doc)
    assert doc.name == "toy" and isinstance(doc.features[1], Last)
    assert root is not None and root.start_mark.line == 0


@pytest.mark.parametrize(
    ("old", "new", "line", "message"),
    [
        ("    window: 60\n", "    window: soon\n", 4, "features[0].window: Input should be a valid integer"),
        (
            "    field: amount\n",
            "    field: amount\n    extra: 1\n",
            7,
            "features[1].extra: Extra inputs are not permitted",
        ),
        ("    field: amount\n", "", 5, "features[1].field: Field required"),
        ("  - kind: last\n", "  - kind: sum\n", 5, "features[1]: Input tag 'sum' found using 'kind'"),
        ("name: toy\n", "", 1, "name: Field required"),
    ],
)
def test_errors_name_file_line_and_field(tmp_path: Path, old: str, new: str, line: int, message: str) -> None:
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(DocError) as info:
        load_document(path, Doc, DocError, union_tags={"count", "last"})
    assert str(info.value).startswith(f"{path}:{line}: {message}")
    assert isinstance(info.value.__cause__, ValidationError)


def test_union_tags_stay_in_the_path_unless_named(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("    window: 60\n", "    window: soon\n"))
    with pytest.raises(DocumentError, match=rf"^{path}:4: features\[0\]\.count\.window: "):
        load_document(path, Doc)


def test_the_whole_document_of_the_wrong_kind(tmp_path: Path) -> None:
    path = write(tmp_path, "- 1\n- 2\n")
    with pytest.raises(DocumentError, match=rf"^{path}:1: <root>: Input should be a valid dictionary"):
        load_document(path, Doc)


def test_yaml_syntax_and_unreadable_files(tmp_path: Path) -> None:
    broken = write(tmp_path, GOOD + "  - [unclosed\n")
    with pytest.raises(DocError, match=rf"^{broken}:\d+: \(yaml\)"):
        parse_yaml(broken, DocError)
    with pytest.raises(DocumentError, match=rf"^{tmp_path / 'nope.yaml'}: cannot read"):
        parse_yaml(tmp_path / "nope.yaml")


def test_document_path() -> None:
    assert document_path(("features", 7, "window")) == "features[7].window"
    assert document_path(("features", 7, "count", "window"), {"count"}) == "features[7].window"
    assert document_path(("features", 7, "count", "window")) == "features[7].count.window"
    assert document_path(("inputs", "amount")) == "inputs.amount"
    assert document_path((0, "x")) == "[0].x"
    assert document_path(()) == "<root>"


def test_cross_field_checks_and_union_tags_point_at_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    data, root = parse_yaml(path)
    error = located_error(path, root, ("features", 1, "field"), "unknown input 'amount'", DocError)
    assert str(error) == f"{path}:6: features[1].field: unknown input 'amount'" and isinstance(error, DocError)
    with pytest.raises(ValidationError) as info:
        Doc.model_validate({**data, "features": [{"kind": "count", "window": "x"}]})
    located = invalid_document(path, root, info.value, DocError, {"count", "last"})
    assert str(located).startswith(f"{path}:4: features[0].window: Input should be a valid integer")
