"""A loaded feature set: its spec, tables and aggregate plan, input validation and the vectorised compute."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
from opentelemetry import trace

from services.common.errors import InvalidArgument
from services.common.tracing import child_span
from services.feature import transforms as tf
from services.feature.bounds import FP32_MAX, SHOWN_VALUE_CHARS, fits_fp32
from services.feature.domain import Features, FieldValue
from services.feature.spec import (
    Aggregate,
    Clip,
    Cyclic,
    FeatureSetError,
    FeatureSetSpec,
    Hashed,
    Identity,
    Log,
    Lookup,
    OneHot,
    Ratio,
    ZScore,
    load_spec,
    load_table,
    output_names,
)
from services.feature.store import AggregatePlan, AggregateResult

log = logging.getLogger(__name__)
tracer = trace.get_tracer("meshserve.feature")

PY_TYPE = {str: "string", int: "int64", float: "double", bool: "bool"}
NP_DTYPE = {"string": object, "int64": np.int64, "double": np.float64, "bool": np.bool_}

MAX_UNIX_S = 2**37  # about the year 6325: keeps times exact in Redis' Lua (doubles)
REQUEST = "request"
ONLINE = "online"
STATIC = "static"


def group_of(feature: object) -> str:
    if isinstance(feature, Aggregate):
        return ONLINE
    if isinstance(feature, Lookup):
        return STATIC
    return REQUEST


@dataclass
class Prepared:
    """A batch's features that need no online aggregate (FeatureSet.prepare), waiting for FeatureSet.finish."""

    columns: Mapping[str, np.ndarray]
    out: np.ndarray  # (rows, columns) FP32, the prepared columns filled in
    values: dict[str, np.ndarray]  # one-column outputs by name (ratios read them)
    defaulted: np.ndarray


class FeatureSet:
    """One versioned feature set (e.g. `fraud_v1`), ready to compute."""

    def __init__(self, spec: FeatureSetSpec, base: Path) -> None:
        self.spec = spec
        self.id = spec.id
        self.tables: dict[int, dict[str, float]] = {}
        for i, f in enumerate(spec.features):
            if isinstance(f, Lookup):
                self.tables[i] = load_table(base / f.table, f.column)
        self.plan = AggregatePlan.of(spec)
        self.names: list[str] = []
        self.groups: list[str] = []
        self.slices: list[slice] = []
        for f in spec.features:
            names = output_names(f)
            self.slices.append(slice(len(self.names), len(self.names) + len(names)))
            self.names += names
            self.groups += [group_of(f)] * len(names)
        # the aggregates written all at once: feature indexes, output columns, then_log1p, then_clip bounds
        aggs = [(i, f) for i, f in enumerate(spec.features) if isinstance(f, Aggregate)]
        self._agg_index = [i for i, _ in aggs]
        self._agg_names = [f.name for _, f in aggs]
        self._agg_entities = [f.entity for _, f in aggs]
        self._agg_columns = np.array([self.slices[i].start for i, _ in aggs], dtype=np.int64)
        self._agg_defaults = np.array([f.default for _, f in aggs], dtype=np.float64)
        self._agg_log1p = np.array([f.then_log1p for _, f in aggs], dtype=bool)
        self._agg_clip = any(f.then_clip is not None for _, f in aggs)
        self._agg_lo = np.array([f.then_clip[0] if f.then_clip else -np.inf for _, f in aggs], dtype=np.float64)
        self._agg_hi = np.array([f.then_clip[1] if f.then_clip else np.inf for _, f in aggs], dtype=np.float64)
        requests = [i for i, f in enumerate(spec.features) if group_of(f) == REQUEST]
        self._ratio_index = [i for i in requests if isinstance(spec.features[i], Ratio)]
        self._request_index = [i for i in requests if not isinstance(spec.features[i], Ratio)]
        self.ingest_fields = sorted(
            {spec.timestamp_field, *spec.entities.values()}
            | {a.field for _, a in self.plan.aggregates if a.field is not None}
        )

    @property
    def has_aggregates(self) -> bool:
        return bool(self.plan.aggregates)

    @property
    def aggregate_names(self) -> list[str]:
        """The aggregate features in the order of Features.nonfinite's columns."""
        return self._agg_names

    def aggregate_entity(self, j: int) -> tuple[str, str]:
        """(entity kind, the input holding its id) of aggregate j (in aggregate_names' order)."""
        kind = self._agg_entities[j]
        return kind, self.spec.entities[kind]

    # -- input -----------------------------------------------------------------------------------

    def columns(
        self,
        rows: Sequence[Mapping[str, FieldValue | None]],
        fields: Sequence[str] | None = None,
        what: str = "row",
        max_field_bytes: int | None = None,
    ) -> dict[str, np.ndarray]:
        """Validated typed columns of the given fields (every input by default); InvalidArgument names row and field.

        A string of over max_field_bytes UTF-8 bytes is refused (its message shows only its first characters).
        """
        inputs = self.spec.inputs
        wanted = list(inputs) if fields is None else list(fields)
        columns: dict[str, np.ndarray] = {}
        for name in wanted:
            expected = inputs[name]
            values: list[FieldValue | None] = [row.get(name) for row in rows]
            kinds = set(map(type, values))  # one Python type of the expected kind: every value is valid
            if len(kinds) != 1 or PY_TYPE.get(kinds.pop()) != expected:
                for r, row in enumerate(rows):  # name the first bad row and field
                    v = values[r]
                    if v is None:
                        kind = "has no value" if name in row else "is missing"
                        raise InvalidArgument(f"{what} {r}: field {name!r} ({expected}) {kind}")
                    got = PY_TYPE.get(type(v))
                    if got != expected:
                        raise InvalidArgument(f"{what} {r}: field {name!r} must be {expected}, got {got}")
            if expected == "string" and max_field_bytes is not None:
                _check_sizes(cast("list[str]", values), name, what, max_field_bytes)  # (all str: checked above)
            col: np.ndarray = np.array(values, dtype=NP_DTYPE[expected])
            if expected == "double":
                bad = ~np.isfinite(col)
                if bad.any():
                    r = int(np.argmax(bad))
                    raise InvalidArgument(f"{what} {r}: field {name!r} is not finite ({col[r]})")
            if name == self.spec.timestamp_field:
                bad = (col < 0) | (col > MAX_UNIX_S)
                if bad.any():
                    r = int(np.argmax(bad))
                    raise InvalidArgument(f"{what} {r}: field {name!r} is not unix seconds ({col[r]})")
            columns[name] = col
        return columns

    def event_columns(
        self, events: Sequence[Mapping[str, FieldValue | None]], max_field_bytes: int | None = None
    ) -> dict[str, np.ndarray]:
        """Validated columns of what Ingest needs; a value its sum / mean / max aggregates cannot hold is refused.

        Aggregates are sent as FP32: an event's value must fit FP32 and, for a sum over n buckets, FP32_MAX / n
        (AggregatePlan.value_limits; the store checks the sums the events make, see ingest.lua).
        """
        columns = self.columns(events, self.ingest_fields, "event", max_field_bytes)
        for name, limit in self.plan.value_limits.items():
            x = columns[name].astype(np.float64)
            bad = ~(np.abs(x) <= limit)
            if bad.any():
                r = int(np.argmax(bad))
                raise InvalidArgument(
                    f"event {r}: field {name!r} is {x[r]:.8g}, more than its aggregates can hold in FP32 "
                    f"(|x| <= {limit:.8g})"
                )
        return columns

    # -- compute ---------------------------------------------------------------------------------

    def compute(self, columns: Mapping[str, np.ndarray], online: AggregateResult | None) -> Features:
        """The feature matrix; `online` None means the store was unavailable (aggregates take defaults)."""
        return self.finish(self.prepare(columns), online)

    def prepare(self, columns: Mapping[str, np.ndarray]) -> Prepared:
        """Everything that needs no online aggregate: static lookups and the request transforms but ratios.

        The handler runs this while the online store read is in flight (the event loop would idle otherwise).
        """
        rows = len(columns[self.spec.timestamp_field])
        out = np.empty((rows, len(self.names)), dtype=np.float32)
        values: dict[str, np.ndarray] = {}  # one-column outputs by name (for ratios)
        defaulted = np.zeros(rows, dtype=bool)
        features = self.spec.features
        if self.tables:
            with child_span(tracer, "feature.static_lookup", {"feature.rows": rows}):
                for i, table in self.tables.items():
                    f = features[i]
                    assert isinstance(f, Lookup)
                    raw, missing = tf.lookup(columns[f.input], table, f.default)
                    defaulted |= missing
                    self._write(out, values, i, self._then(i, raw))
        with child_span(tracer, "feature.request_transforms", {"feature.rows": rows}):
            for i in self._request_index:
                f = features[i]
                if isinstance(f, Cyclic):
                    sin, cos = tf.cyclic(columns[f.input], f.period)
                    out[:, self.slices[i]] = np.stack([sin, cos], axis=1)
                elif isinstance(f, OneHot):
                    out[:, self.slices[i]] = tf.one_hot(columns[f.input], f.categories, f.other)
                elif isinstance(f, Hashed):
                    out[:, self.slices[i]] = tf.hashed(columns[f.input], f.buckets)
                else:
                    assert isinstance(f, Identity | Log | Clip | ZScore)  # (ratios are computed in finish)
                    x = columns[f.input].astype(np.float64)
                    if isinstance(f, Log):
                        x = tf.log1p_pos(x)
                    elif isinstance(f, Clip):
                        x = np.clip(x, f.min, f.max)
                    elif isinstance(f, ZScore):
                        x = tf.zscore(x, f.mean, f.std)
                    x = self._then(i, x)
                    bad = ~fits_fp32(x)
                    if bad.any():  # made from the caller's own value alone: the caller's error
                        r = int(np.argmax(bad))
                        raise InvalidArgument(
                            f"row {r}: feature {f.name!r} is {x[r]:.8g} (from field {f.input!r}), "
                            f"beyond what FP32 holds (|x| <= {FP32_MAX:.8g})"
                        )
                    self._write(out, values, i, x)
        return Prepared(columns, out, values, defaulted)

    def finish(self, prepared: Prepared, online: AggregateResult | None) -> Features:
        """The aggregates (their defaults when `online` is None: the store was unavailable), then the ratios."""
        columns, out, values = prepared.columns, prepared.out, prepared.values
        rows = len(out)
        defaulted = prepared.defaulted.copy()
        degraded = np.zeros(rows, dtype=bool)
        nonfinite = None
        if self.has_aggregates:  # the Redis read itself is the handler's `feature.online_lookup` span
            if online is None:
                degraded[:] = True
                defaulted[:] = True
                x = np.broadcast_to(self._agg_defaults, (rows, len(self._agg_index))).copy()
            else:
                defaulted |= online.defaulted
                x = np.empty((rows, len(self._agg_index)), dtype=np.float64)
                for j, i in enumerate(self._agg_index):
                    x[:, j] = online.values[i]
                fits = fits_fp32(x)
                if not fits.all():  # the store's failure (ingest refuses what cannot be held): as if it were down
                    nonfinite = ~fits
                    poisoned = nonfinite.any(axis=1)
                    x[poisoned] = self._agg_defaults
                    degraded |= poisoned
                    defaulted |= poisoned
            # as _then does one column at a time: then_log1p, then_clip
            x[:, self._agg_log1p] = tf.log1p_pos(x[:, self._agg_log1p])
            if self._agg_clip:
                x = np.clip(x, self._agg_lo, self._agg_hi)
            out[:, self._agg_columns] = x
            for j, name in enumerate(self._agg_names):
                values[name] = x[:, j]
        for i in self._ratio_index:  # in feature order: a ratio may use an earlier one (a few microseconds)
            f = self.spec.features[i]
            assert isinstance(f, Ratio)
            num = values.get(f.numerator, columns.get(f.numerator))
            den = values.get(f.denominator, columns.get(f.denominator))
            raw, zero = tf.ratio(np.asarray(num, np.float64), np.asarray(den, np.float64), f.default)
            x = self._then(i, raw)
            beyond = ~fits_fp32(x)
            if beyond.any():  # a quotient FP32 cannot hold is as undefined as one by zero
                zero |= beyond
                x = self._then(i, np.where(beyond, f.default, raw))
            defaulted |= zero
            self._write(out, values, i, x)
        return Features(out, defaulted, degraded, nonfinite)

    def _then(self, i: int, raw: np.ndarray) -> np.ndarray:
        """The feature's then_log1p / then_clip applied to its raw values."""
        f = self.spec.features[i]
        x = np.asarray(raw, dtype=np.float64)
        if f.then_log1p:
            x = tf.log1p_pos(x)
        if f.then_clip is not None:
            x = np.clip(x, *f.then_clip)
        return x

    def _write(self, out: np.ndarray, values: dict[str, np.ndarray], i: int, x: np.ndarray) -> None:
        """Write a one-column feature's final values (ratios after it read them by name)."""
        values[self.spec.features[i].name] = x
        out[:, self.slices[i].start] = x


def _check_sizes(values: Sequence[str], name: str, what: str, limit: int) -> None:
    """InvalidArgument for the first string over `limit` UTF-8 bytes, naming row and field, not echoing it."""
    if max(map(len, values)) * 4 <= limit:  # a character is at most 4 bytes: nothing to encode
        return
    for r, v in enumerate(values):
        if len(v) * 4 > limit:
            size = len(v.encode("utf-8", "surrogatepass"))
            if size > limit:
                raise InvalidArgument(
                    f"{what} {r}: field {name!r} is {size} bytes; at most {limit} (it starts {v[:SHOWN_VALUE_CHARS]!r})"
                )


def load_feature_sets(folder: Path) -> dict[str, FeatureSet]:
    """Every `*.yaml` in folder, by id (`fraud_v1`); FeatureSetError names file, line and field."""
    sets: dict[str, FeatureSet] = {}
    for path in sorted(folder.glob("*.yaml")):
        spec = load_spec(path)
        if spec.id in sets:
            raise FeatureSetError(f"{path}: feature set {spec.id} is defined twice")
        sets[spec.id] = FeatureSet(spec, path.parent)
        log.info("feature set %s: %d inputs -> %d features", spec.id, len(spec.inputs), len(sets[spec.id].names))
    return sets
