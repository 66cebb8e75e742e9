"""Hypothesis strategies for protobuf requests built from descriptors alone: arbitrary messages of a type, valid
messages with one field changed, and raw bodies (random bytes, cut or corrupted serializations)."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

F = FieldDescriptor
Draw = Callable[[st.SearchStrategy[Any]], Any]
# A field's place in a message: the (field name, index or map key or None) steps from the top to the message that
# holds it, and the field.
Slot = tuple[tuple[tuple[str, Any], ...], FieldDescriptor]

_INT_RANGES = {
    **dict.fromkeys((F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32), (-(2**31), 2**31 - 1)),
    **dict.fromkeys((F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64), (-(2**63), 2**63 - 1)),
    **dict.fromkeys((F.TYPE_UINT32, F.TYPE_FIXED32), (0, 2**32 - 1)),
    **dict.fromkeys((F.TYPE_UINT64, F.TYPE_FIXED64), (0, 2**64 - 1)),
}
_EDGE_INTS = (0, 1, -1, 2, 7, 64, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**62, -(2**31), -(2**53))
_EDGE_FLOATS = (0.0, -0.0, 1.0, -1.0, math.nan, math.inf, -math.inf, 1e300, -1e300, 1e39, -1e39, 5e-324, 2.0**63)
_EDGE_FLOATS_32 = (0.0, -0.0, 1.0, -1.0, math.nan, math.inf, -math.inf, 3.4028234663852886e38, 1e-45)
# Strings a careless or hostile caller sends: empty, control characters, globs, paths, numbers as text, a few kB.
_EDGE_TEXT = (
    "",
    " ",
    "\x00",
    "a\r\nb: c",
    "0",
    "-1",
    "1e999",
    "NaN",
    "*",
    "?[a-z]",
    "%s%n{0}",
    "../" * 8 + "etc/passwd",
    "/tmp/x/y",
    "no_such_thing",
    "é" * 1500,
    "\U0001f600" * 700,
    "x" * 4096,
)
# Little-endian FP32/FP64 NaN and Inf patterns: raw tensor contents that decode to non-finite values.
_NAN32, _INF32, _NAN64 = struct.pack("<f", math.nan), struct.pack("<f", math.inf), struct.pack("<d", math.nan)
_MAX32, _MAX64 = struct.pack("<f", 3.4028234663852886e38), struct.pack("<d", 1.7976931348623157e308)


@dataclass(frozen=True)
class Limits:
    """How large a generated message may get, and names worth trying in its string fields."""

    depth: int = 3  # levels of nested messages below the request
    items: int = 4  # elements of a repeated field or entries of a map
    text: int = 24  # characters of an arbitrary string
    binary: int = 64  # bytes of an arbitrary bytes field
    names: tuple[str, ...] = ()  # model, pipeline, tensor, feature-set names, datatypes...


def is_map(field: FieldDescriptor) -> bool:
    return field.type == F.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


def _edge_ints(lo: int, hi: int) -> list[int]:
    return sorted({v for v in (*_EDGE_INTS, lo, hi, hi - 1, lo + 1) if lo <= v <= hi})


def scalars(field: FieldDescriptor, limits: Limits) -> st.SearchStrategy[Any]:
    """Any value of a scalar field's type, edges (extremes, NaN/Inf, empty, kB-long, known names) weighted in."""
    kind = field.type
    if kind in _INT_RANGES:
        lo, hi = _INT_RANGES[kind]
        return st.sampled_from(_edge_ints(lo, hi)) | st.integers(lo, hi)
    if kind == F.TYPE_DOUBLE:
        return st.sampled_from(_EDGE_FLOATS) | st.floats()
    if kind == F.TYPE_FLOAT:
        return st.sampled_from(_EDGE_FLOATS_32) | st.floats(width=32)
    if kind == F.TYPE_BOOL:
        return st.booleans()
    if kind == F.TYPE_STRING:
        return st.sampled_from(_EDGE_TEXT + limits.names) | st.text(max_size=limits.text)
    if kind == F.TYPE_BYTES:
        return st.sampled_from((b"", b"\x00", _NAN32 * 4, struct.pack("<I", 2**31) + b"x")) | st.binary(
            max_size=limits.binary
        )
    if kind == F.TYPE_ENUM:
        known = st.sampled_from([v.number for v in field.enum_type.values])
        return known if field.enum_type.is_closed else known | st.integers(-(2**31), 2**31 - 1)
    raise TypeError(f"{field.full_name}: no strategy for field type {kind}")


def _element(field: FieldDescriptor, limits: Limits, depth: int) -> st.SearchStrategy[Any]:
    """One value of a field (one element if repeated): a scalar, or a message one level down."""
    if field.type == F.TYPE_MESSAGE:
        return messages(field.message_type, limits, depth - 1)
    return scalars(field, limits)


def field_values(field: FieldDescriptor, limits: Limits, depth: int) -> st.SearchStrategy[Any]:
    """What `assign` takes for a field: a dict for a map, a list for a repeated field, else one value."""
    if is_map(field):
        entry = field.message_type
        keys = scalars(entry.fields_by_name["key"], limits)
        return st.dictionaries(keys, _element(entry.fields_by_name["value"], limits, depth), max_size=limits.items)
    if field.is_repeated:
        return st.lists(_element(field, limits, depth), max_size=limits.items)
    return _element(field, limits, depth)


def assign(message: Message, field: FieldDescriptor, value: Any) -> None:
    """Set a field of `message` from a `field_values` value (maps and repeated fields are added to)."""
    if is_map(field):
        target = getattr(message, field.name)
        message_valued = field.message_type.fields_by_name["value"].type == F.TYPE_MESSAGE
        for key, item in value.items():
            if message_valued:
                target[key].CopyFrom(item)
            else:
                target[key] = item
    elif field.is_repeated:
        getattr(message, field.name).extend(value)
    elif field.type == F.TYPE_MESSAGE:
        getattr(message, field.name).CopyFrom(value)
    else:
        setattr(message, field.name, value)


@cache
def messages(descriptor: Descriptor, limits: Limits = Limits(), depth: int | None = None) -> st.SearchStrategy[Message]:
    """Arbitrary messages of a type: each field set or not, at most one member of each oneof, maps, repeated and
    nested messages (down to `depth` levels; below it message fields stay unset), sizes within `limits`."""
    depth = limits.depth if depth is None else depth
    cls = GetMessageClass(descriptor)

    def usable(field: FieldDescriptor) -> bool:
        return depth > 0 or field.type != F.TYPE_MESSAGE

    plain = [f for f in descriptor.fields if f.containing_oneof is None and usable(f)]
    oneofs = [members for o in descriptor.oneofs if (members := [f for f in o.fields if usable(f)])]

    @st.composite
    def build(draw: Draw) -> Message:
        message = cls()
        for field in plain:
            if draw(st.booleans()):
                assign(message, field, draw(field_values(field, limits, depth)))
        for members in oneofs:
            chosen = draw(st.none() | st.sampled_from(members))
            if chosen is not None:
                assign(message, chosen, draw(_element(chosen, limits, depth)))
        return message

    return build()


def slots(message: Message, path: tuple[tuple[str, Any], ...] = ()) -> list[Slot]:
    """Every field of `message` and of the messages it holds (each element of a repeated field, each map value),
    set or not: the places a one-field mutation can change."""
    found: list[Slot] = []
    for field in message.DESCRIPTOR.fields:
        found.append((path, field))
        if field.type != F.TYPE_MESSAGE:
            continue
        value = getattr(message, field.name)
        if is_map(field):
            if field.message_type.fields_by_name["value"].type == F.TYPE_MESSAGE:
                for key in sorted(value):
                    found.extend(slots(value[key], (*path, (field.name, key))))
        elif field.is_repeated:
            for i, item in enumerate(value):
                found.extend(slots(item, (*path, (field.name, i))))
        elif message.HasField(field.name):
            found.extend(slots(value, (*path, (field.name, None))))
    return found


def _resolve(message: Message, path: tuple[tuple[str, Any], ...]) -> Message:
    for name, step in path:
        value = getattr(message, name)
        message = value if step is None else value[step]
    return message


def _bytes_edges(current: bytes) -> st.SearchStrategy[bytes]:
    """A bytes value changed the ways raw tensors go wrong: cut, padded, doubled, NaN/Inf-filled, ending in the
    largest finite float, same-size random (random FP32 bytes hold NaNs and huge values; random BYTES lengths point
    past the end)."""
    n = len(current)
    options = [b"", current[: n // 2], current[:-1], current + b"\x00", current * 2, b"\xff" * n]
    options += [_NAN32 * (n // 4), _INF32 * (n // 4), _NAN64 * (n // 8), struct.pack("<I", 2**31) + current[4:]]
    options += [current[:-4] + _MAX32, current[:-8] + _MAX64]  # the largest finite FP32/FP64 as the last value
    return st.sampled_from(options) | st.binary(min_size=n, max_size=n) | st.binary(max_size=4096)


def _changed_value(field: FieldDescriptor, current: Any, limits: Limits) -> st.SearchStrategy[Any]:
    """A new value for a singular field (or one element of a repeated one)."""
    if field.type == F.TYPE_MESSAGE:
        return messages(field.message_type, limits, 2)
    if field.type == F.TYPE_BYTES and isinstance(current, bytes):
        return _bytes_edges(current)
    if field.type == F.TYPE_BOOL and isinstance(current, bool):
        return st.just(not current)
    return scalars(field, limits)


def _copy(value: Any) -> Any:
    """A message detached from its parent (one cleared below keeps nothing alive); scalars as they are."""
    if not isinstance(value, Message):
        return value
    copy = type(value)()
    copy.CopyFrom(value)
    return copy


def _mutate(draw: Draw, holder: Message, field: FieldDescriptor, limits: Limits) -> None:
    """Change one field of `holder` in place: set, clear, or (repeated, map) drop, duplicate, replace or add."""
    name = field.name
    if is_map(field):
        target = getattr(holder, name)
        keys = sorted(target)
        how = draw(st.sampled_from(["clear", "drop", "add"] if keys else ["add"]))
        if how == "clear":
            holder.ClearField(name)
        elif how == "drop":
            del target[draw(st.sampled_from(keys))]
        else:
            key_field = field.message_type.fields_by_name["key"]
            key = draw(st.sampled_from(keys) | scalars(key_field, limits) if keys else scalars(key_field, limits))
            value = draw(_element(field.message_type.fields_by_name["value"], limits, 2))
            if key in target:
                del target[key]
            assign(holder, field, {key: value})
        return
    if field.is_repeated:
        items = [_copy(item) for item in getattr(holder, name)]
        how = draw(st.sampled_from(["clear", "drop", "duplicate", "replace", "extend"] if items else ["extend"]))
        if how == "extend":
            value = draw(_changed_value(field, None, limits))
            count = draw(st.sampled_from([1, 2, 8, 64]))
            items += [value] * count
        elif how == "clear":
            items = []
        else:
            i = draw(st.integers(0, len(items) - 1))
            if how == "drop":
                del items[i]
            elif how == "duplicate":
                items.insert(i, items[i])
            else:
                items[i] = draw(_changed_value(field, items[i], limits))
        holder.ClearField(name)
        assign(holder, field, items)
        return
    if field.type == F.TYPE_MESSAGE and holder.HasField(name) and draw(st.booleans()):
        holder.ClearField(name)
        return
    assign(holder, field, draw(_changed_value(field, getattr(holder, name), limits)))


def mutated(seeds: Sequence[Message], limits: Limits = Limits()) -> st.SearchStrategy[Message]:
    """Valid messages (`seeds`, of one type) with one field changed: any field at any depth, set or unset."""
    options = [(seed, slot) for seed in seeds for slot in slots(seed)]
    if not options:  # a request type without fields: nothing to change
        return st.sampled_from(list(seeds))

    @st.composite
    def build(draw: Draw) -> Message:
        seed, (path, field) = draw(st.sampled_from(options))
        message = _copy(seed)
        _mutate(draw, _resolve(message, path), field, limits)
        return message

    return build()


def raw_bodies(seeds: Sequence[bytes], limits: Limits = Limits()) -> st.SearchStrategy[bytes]:
    """Request bodies as bytes: random, or a valid serialization cut short, with one byte changed, or with bytes
    appended (some of these still parse, as other messages than the caller meant)."""
    random = st.binary(max_size=4 * limits.binary)
    serialized = [s for s in seeds if s]
    if not serialized:
        return random
    seed = st.sampled_from(serialized)
    cut = seed.flatmap(lambda s: st.integers(0, len(s) - 1).map(lambda n: s[:n]))
    flipped = st.tuples(seed, st.integers(0, 2**16), st.integers(0, 255)).map(
        lambda t: t[0][: t[1] % len(t[0])] + bytes([t[2]]) + t[0][t[1] % len(t[0]) + 1 :]
    )
    appended = st.tuples(seed, st.binary(min_size=1, max_size=16)).map(lambda t: t[0] + t[1])
    return random | cut | flipped | appended
