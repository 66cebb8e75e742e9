"""The one formatter of pydantic validation errors: dotted paths, pydantic's order, unknown fields said plainly."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from services.common.validation import UNKNOWN_FIELD, describe, field_path, problems


class Route(BaseModel):
    model_config = ConfigDict(extra="forbid")
    host: str
    weight: int = 100


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    routes: list[Route]


def invalid(data: object) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        Spec.model_validate(data)
    return info.value


def test_field_path() -> None:
    assert field_path(("spec", "http", 0, "route")) == "spec.http.0.route"
    assert field_path(()) == "<root>"


def test_problems_in_order_with_unknown_fields_named() -> None:
    exc = invalid({"name": "r", "routes": [{"host": "a"}, {"weight": "heavy", "retries": 3}], "extra": 1})
    assert problems(exc) == [
        (("routes", 1, "host"), "Field required"),
        (("routes", 1, "weight"), "Input should be a valid integer, unable to parse string as an integer"),
        (("routes", 1, "retries"), UNKNOWN_FIELD),
        (("extra",), UNKNOWN_FIELD),
    ]


def test_describe_on_one_line() -> None:
    exc = invalid({"routes": [{"host": "a", "timeout": "1s"}]})
    assert describe(exc) == "name: Field required; routes.0.timeout: unknown field"
    assert describe(exc, "not supported by the local mesh") == (
        "name: Field required; routes.0.timeout: not supported by the local mesh"
    )
    assert describe(invalid([1, 2])) == "<root>: Input should be a valid dictionary or instance of Spec"
