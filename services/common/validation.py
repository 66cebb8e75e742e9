"""The one formatter of pydantic validation errors: each problem as a dotted field path and a message."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError

# What a user reads when a file names a field the schema does not have (pydantic says "Extra inputs are not
# permitted"): callers say why, e.g. that the local mesh does not support it.
UNKNOWN_FIELD = "unknown field"


def field_path(loc: Sequence[str | int]) -> str:
    """`spec.http.0.route` style path of a pydantic error location (`<root>` for the document itself)."""
    return ".".join(str(part) for part in loc) or "<root>"


def problems(exc: ValidationError, unknown_field: str = UNKNOWN_FIELD) -> list[tuple[tuple[str | int, ...], str]]:
    """(location, message) of every problem, in pydantic's order; unknown fields get `unknown_field`."""
    return [
        (tuple(err["loc"]), unknown_field if err["type"] == "extra_forbidden" else err["msg"]) for err in exc.errors()
    ]


def describe(exc: ValidationError, unknown_field: str = UNKNOWN_FIELD) -> str:
    """Every problem on one line: `path: message; path: message`."""
    return "; ".join(f"{field_path(loc)}: {message}" for loc, message in problems(exc, unknown_field))
