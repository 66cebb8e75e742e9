"""Feature sets declared in YAML (`features/<name>_v<N>.yaml`), validated by pydantic.

A file names its typed inputs, the entity keys aggregates are kept per, and an ordered list of
features; each feature yields one or more FP32 output columns. An error names the file, the line and
the field (found through yaml's node marks), e.g. `features/fraud_v1.yaml:41: features[7].window: ...`.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from services.common import validation
from services.common.yaml_docs import UNKNOWN_KEY, DocumentError, located_error, parse_yaml
from services.feature.bounds import FP32_MAX

InputType = Literal["string", "int64", "double", "bool"]
NUMERIC: tuple[str, ...] = ("int64", "double", "bool")
_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# What a feature takes where it has no value (a degraded row takes every aggregate's): sent as FP32 like any other.
Fp32 = Annotated[float, Field(ge=-FP32_MAX, le=FP32_MAX)]


def parse_duration(text: str) -> int:
    """`10m`, `1h`, `24h`, `7d` -> seconds."""
    m = _DURATION.match(text.strip())
    if not m or int(m.group(1)) == 0:
        raise ValueError(f"{text!r} is not a duration like 30s, 10m, 1h, 7d")
    return int(m.group(1)) * _UNIT_S[m.group(2)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Feature(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="Output column name (or prefix for several).")
    then_log1p: bool = Field(False, description="Apply log1p(max(x, 0)) to the result.")
    then_clip: tuple[float, float] | None = Field(None, description="Clip the result to [lo, hi] (after log1p).")

    @field_validator("then_clip")
    @classmethod
    def _ordered(cls, v: tuple[float, float] | None) -> tuple[float, float] | None:
        if v is not None and v[0] > v[1]:
            raise ValueError("then_clip: lo must not exceed hi")
        return v


# -- request transforms -----------------------------------------------------------------------------


class Identity(_Feature):
    """A numeric or bool input as is (bool -> 0/1)."""

    kind: Literal["identity"]
    input: str


class Log(_Feature):
    """log1p(max(x, 0))."""

    kind: Literal["log"]
    input: str


class Clip(_Feature):
    kind: Literal["clip"]
    input: str
    min: float
    max: float

    @model_validator(mode="after")
    def _min_max_ordered(self) -> Clip:
        if self.min > self.max:
            raise ValueError("min must not exceed max")
        return self


class ZScore(_Feature):
    """(x - mean) / std with stored statistics (from training data)."""

    kind: Literal["zscore"]
    input: str
    mean: float
    std: float = Field(gt=0)


class Cyclic(_Feature):
    """sin/cos of the hour of day or day of week of an INT64 unix-seconds field (UTC): `<name>_sin`, `<name>_cos`."""

    kind: Literal["cyclic"]
    input: str
    period: Literal["hour_of_day", "day_of_week"]


class OneHot(_Feature):
    """One column per category (`<name>_<category>`), plus `<name>_other` unless other: false."""

    kind: Literal["onehot"]
    input: str
    categories: list[Annotated[str, Field(pattern=r"^[a-z0-9_]+$")]] = Field(min_length=1)
    other: bool = True


class Hashed(_Feature):
    """The hashing trick: one-hot over `buckets` columns (`<name>_<i>`) by a stable hash (CRC32) of the value."""

    kind: Literal["hashed"]
    input: str
    buckets: int = Field(ge=2, le=4096)


class Ratio(_Feature):
    """numerator / denominator; each names a numeric input or a one-column feature declared earlier."""

    kind: Literal["ratio"]
    numerator: str
    denominator: str
    default: Fp32 = Field(0.0, description="Value where the denominator is 0 (or the quotient beyond FP32).")


# -- online aggregates ------------------------------------------------------------------------------

AggOp = Literal["count", "sum", "mean", "max", "distinct", "since_last"]


class Aggregate(_Feature):
    """An aggregate over the events of one entity (e.g. the row's user) in a sliding window, as of event time.

    The window is made of `window / bucket` whole time buckets ending at the start of the bucket that
    holds the row's event time, so nothing at or after that bucket (the row itself, later events) leaks
    in. since_last is exact to the second (events strictly before the row's time).
    """

    kind: Literal["aggregate"]
    entity: str
    op: AggOp
    field: str | None = Field(None, description="Input aggregated (sum, mean, max: numeric; distinct: any).")
    window: str | None = Field(None, description="Window length, e.g. 10m, 1h, 24h, 7d (not for since_last).")
    bucket: str | None = Field(None, description="Bucket length; default window/10 (must divide the window).")
    default: Fp32 = Field(0.0, description="Value when there is no data or the store is unavailable.")

    @field_validator("window")
    @classmethod
    def _window(cls, v: str | None) -> str | None:
        if v is not None:
            parse_duration(v)
        return v

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, v: str | None, info: ValidationInfo) -> str | None:
        window = info.data.get("window")
        if v is not None and window is not None:
            if parse_duration(window) % parse_duration(v):
                raise ValueError(f"bucket {v} does not divide window {window}")
        return v

    @model_validator(mode="after")
    def _shape(self) -> Aggregate:
        if self.op in ("sum", "mean", "max", "distinct") and self.field is None:
            raise ValueError(f"op {self.op} needs a field")
        if self.op in ("count", "since_last") and self.field is not None:
            raise ValueError(f"op {self.op} takes no field")
        if self.op == "since_last":
            if self.window is not None or self.bucket is not None:
                raise ValueError("since_last takes no window or bucket")
            return self
        if self.window is None:
            raise ValueError(f"op {self.op} needs a window")
        if not self.bucket and self.window_s % 10:
            raise ValueError(f"window {self.window} needs a bucket (it is not a multiple of 10 s)")
        return self

    @property
    def window_s(self) -> int:
        return parse_duration(self.window) if self.window else 0

    @property
    def bucket_s(self) -> int:
        if not self.window:
            return 0
        return parse_duration(self.bucket) if self.bucket else self.window_s // 10


# -- static lookups ---------------------------------------------------------------------------------


class Lookup(_Feature):
    """A column of a CSV table (first column the key, path relative to the YAML file) keyed by an input."""

    kind: Literal["lookup"]
    input: str
    table: str
    column: str
    default: Fp32 = 0.0


Feature = Annotated[
    Identity | Log | Clip | ZScore | Cyclic | OneHot | Hashed | Ratio | Aggregate | Lookup,
    Field(discriminator="kind"),
]
REQUEST_KINDS = ("identity", "log", "clip", "zscore", "cyclic", "onehot", "hashed", "ratio")
KINDS = (*REQUEST_KINDS, "aggregate", "lookup")


class FeatureSetSpec(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    version: int = Field(ge=1)
    description: str = ""
    timestamp_field: str = Field(description="INT64 unix-seconds input that aggregates are computed as of.")
    inputs: dict[str, InputType] = Field(min_length=1)
    entities: dict[str, str] = Field(description="Entity name -> the string or int64 input that keys it.")
    features: list[Feature] = Field(min_length=1)
    outputs: int | None = Field(None, ge=1, description="Expected number of output columns (checked).")

    @property
    def id(self) -> str:
        return f"{self.name}_v{self.version}"


def output_names(feature: _Feature) -> list[str]:
    """The output columns one feature yields."""
    if isinstance(feature, Cyclic):
        return [f"{feature.name}_sin", f"{feature.name}_cos"]
    if isinstance(feature, OneHot):
        return [f"{feature.name}_{c}" for c in feature.categories] + (
            [f"{feature.name}_other"] if feature.other else []
        )
    if isinstance(feature, Hashed):
        return [f"{feature.name}_{i}" for i in range(feature.buckets)]
    return [feature.name]


class FeatureSetError(DocumentError):
    """A feature set file that does not validate; the message names file, line and field."""


def _error(path: Path, root: yaml.Node | None, loc: tuple[int | str, ...], message: str) -> DocumentError:
    return located_error(path, root, loc, message, FeatureSetError, KINDS)


def _check_references(spec: FeatureSetSpec, base: Path) -> list[tuple[tuple[int | str, ...], str]]:
    """Cross-field checks pydantic cannot do alone; (location, message) pairs."""
    errors: list[tuple[tuple[int | str, ...], str]] = []
    inputs = spec.inputs
    if inputs.get(spec.timestamp_field) != "int64":
        errors.append((("timestamp_field",), f"{spec.timestamp_field!r} must be an int64 input"))
    for entity, field in spec.entities.items():
        if inputs.get(field) not in ("string", "int64"):
            errors.append((("entities", entity), f"{field!r} must be a string or int64 input"))
    seen: dict[str, int] = {}  # output name -> columns of the feature that made it (1: usable by ratio)
    for i, f in enumerate(spec.features):
        loc: tuple[int | str, ...] = ("features", i)
        used = [("input", getattr(f, "input", None)), ("field", getattr(f, "field", None))]
        for attr, name in used:
            if name is not None and name not in inputs:
                errors.append(((*loc, attr), f"unknown input {name!r}"))
        if isinstance(f, Identity | Log | Clip | ZScore) and inputs.get(f.input) not in NUMERIC:
            errors.append(((*loc, "input"), f"{f.input!r} is not numeric"))
        if isinstance(f, Cyclic) and inputs.get(f.input) != "int64":
            errors.append(((*loc, "input"), f"{f.input!r} must be an int64 unix-seconds input"))
        if isinstance(f, OneHot | Hashed | Lookup) and inputs.get(f.input) not in ("string", "int64", "bool"):
            errors.append(((*loc, "input"), f"{f.input!r} must be a string, int64 or bool input"))
        if isinstance(f, Aggregate):
            if f.entity not in spec.entities:
                errors.append(((*loc, "entity"), f"unknown entity {f.entity!r}"))
            if f.op in ("sum", "mean", "max") and inputs.get(f.field or "") not in NUMERIC:
                errors.append(((*loc, "field"), f"{f.field!r} is not numeric"))
        if isinstance(f, Ratio):
            for attr in ("numerator", "denominator"):
                ref = getattr(f, attr)
                if seen.get(ref) != 1 and inputs.get(ref) not in NUMERIC:
                    errors.append(((*loc, attr), f"{ref!r} is neither a numeric input nor a one-column feature above"))
        if isinstance(f, Lookup):
            table = base / f.table
            if not table.is_file():
                errors.append(((*loc, "table"), f"no table file {table}"))
            else:
                with table.open(newline="") as fh:
                    header = next(csv.reader(fh), [])
                if f.column not in header[1:]:
                    errors.append(((*loc, "column"), f"{table.name} has no column {f.column!r} (has {header[1:]})"))
        names = output_names(f)
        for name in names:
            if name in seen or name in inputs:
                errors.append(((*loc, "name"), f"output {name!r} is already defined"))
            seen[name] = len(names)
    total = len(seen)
    if spec.outputs is not None and total != spec.outputs:
        errors.append((("outputs",), f"declares {spec.outputs} outputs but the features yield {total}"))
    return errors


def load_spec(path: Path) -> FeatureSetSpec:
    """Parse and validate one feature set file; FeatureSetError names file, line and field on failure."""
    data, root = parse_yaml(path, FeatureSetError)
    try:
        spec = FeatureSetSpec.model_validate(data)
    except ValidationError as exc:
        loc, message = validation.problems(exc, UNKNOWN_KEY)[0]  # worded as every YAML document's errors
        if exc.errors()[0]["type"] in ("union_tag_invalid", "union_tag_not_found"):
            loc += ("kind",)  # point at the kind key (or, when it is missing, the feature)
        raise _error(path, root, loc, message) from exc
    problems = _check_references(spec, path.parent)
    if problems:
        loc, message = problems[0]
        raise _error(path, root, loc, message)
    if path.stem != spec.id:
        raise _error(path, root, ("name",), f"file {path.name} must be named {spec.id}.yaml")
    return spec


def load_table(path: Path, column: str) -> dict[str, float]:
    """key (first column) -> float value of `column`."""
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        key = reader.fieldnames[0] if reader.fieldnames else ""
        table = {row[key]: float(row[column]) for row in reader}
    for k, v in table.items():
        if not abs(v) <= FP32_MAX:  # (NaN too)
            raise FeatureSetError(f"{path}: {column} of {k!r} is {v}, not a value FP32 holds (|x| <= {FP32_MAX:.8g})")
    return table
