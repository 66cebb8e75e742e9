"""A collected trace made whole before export: callee spans behind an unrecorded mesh hop hung on the caller's span,
the request's root freed of its unrecorded caller, and the root marked with why the trace was kept and, when a
process lost its part (its buffer rolled over, or it could not be asked while spans are missing), with
`meshserve.partial` and which process: never silently incomplete.

Envoy and outside callers record nothing unless they sample. A kept trace that was not sampled therefore holds no
span of theirs: a callee's server span names a parent (Envoy's) that nobody recorded. The callee also recorded the
span id its caller sent in `x-meshserve-parent` (`via`), and the collector hangs it there, keeping the unrecorded
parent's id in `meshserve.unrecorded_parent`. When Envoy's access log records were collected too
(services/traces/access_spans.py), Envoy's hops are rebuilt from them with the ids the callees saw.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from services.common.recording.otlp import IS_REMOTE, VIA, any_value
from services.common.recording.spans import (
    ACCESS_LOG,
    LINKED,
    PARTIAL,
    PARTIAL_PROCESSES,
    TRIGGER,
    UNRECORDED_PARENT,
)

SERVER = trace_pb2.Span.SPAN_KIND_SERVER
CLIENT = trace_pb2.Span.SPAN_KIND_CLIENT
ERROR = trace_pb2.Status.STATUS_CODE_ERROR
COLLECTION_SPAN = "meshserve.collection"  # marks a kept trace whose root was lost


@dataclass
class Part:
    """One process's answer to a collection: its spans (None when it did not answer) and the traces it lost."""

    label: str  # `service@address`, as the collector asked it
    resource: trace_pb2.ResourceSpans | None
    lost: set[bytes] = field(default_factory=set)

    @property
    def answered(self) -> bool:
        return self.resource is not None


def _attr(span: trace_pb2.Span, key: str) -> common_pb2.AnyValue | None:
    for kv in span.attributes:
        if kv.key == key:
            return kv.value
    return None


def set_attr(span: trace_pb2.Span, key: str, value: Any) -> None:
    """Set (or replace) one attribute of an OTLP span."""
    for kv in span.attributes:
        if kv.key == key:
            kv.value.CopyFrom(any_value(value))
            return
    span.attributes.append(common_pb2.KeyValue(key=key, value=any_value(value)))


def _pop_via(span: trace_pb2.Span) -> bytes:
    for i, kv in enumerate(span.attributes):
        if kv.key == VIA:
            del span.attributes[i]
            try:
                return bytes.fromhex(kv.value.string_value)
            except ValueError:
                return b""
    return b""


@dataclass
class Outcome:
    """What the collection of one trace found."""

    spans: int
    missing: list[str]  # the processes that lacked their part, and why

    @property
    def partial(self) -> bool:
        return bool(self.missing)


def assemble(parts: Sequence[Part], triggers: Mapping[bytes, set[str]]) -> dict[bytes, Outcome]:
    """Fix up and mark, in place, the spans of each trace in `triggers` (id -> why it is kept) across `parts`
    (parts[0] is the collector's own). A kept trace none of whose spans were found still gets a marked
    COLLECTION_SPAN in parts[0]; a trace kept only as LINKED is left out when nothing of it was found."""
    by_trace: dict[bytes, list[tuple[int, trace_pb2.Span]]] = {}
    for index, part in enumerate(parts):
        if part.resource is None:
            continue
        for scope in part.resource.scope_spans:
            for span in scope.spans:
                by_trace.setdefault(span.trace_id, []).append((index, span))
    unreachable = [p.label for p in parts[1:] if not p.answered]
    outcomes: dict[bytes, Outcome] = {}
    for trace_id, names in triggers.items():
        items = by_trace.get(trace_id, [])
        missing = [f"{p.label}: buffer rolled over" for p in parts if trace_id in p.lost]
        if not items:
            if names - {LINKED} or missing:
                missing = missing or ["every process: no spans found"]
                _marker(parts[0], trace_id, names, missing)
            outcomes[trace_id] = Outcome(0, missing)
            continue
        _reparent(items)
        missing += _missing_callees(items, unreachable, answered=any(p.answered for p in parts[1:]))
        root = _root(items)
        if root is None:
            _marker(parts[0], trace_id, names, missing)
        else:
            _mark(root, names, missing)
        outcomes[trace_id] = Outcome(len(items), missing)
    return outcomes


def _reparent(items: list[tuple[int, trace_pb2.Span]]) -> None:
    by_id = {span.span_id: span for _, span in items}
    for index, span in items:
        via = _pop_via(span)
        parent = span.parent_span_id
        if not parent or parent in by_id:
            continue
        if via and via in by_id:
            set_attr(span, UNRECORDED_PARENT, parent.hex())
            span.parent_span_id = via
        elif (index == 0 or _attr(span, ACCESS_LOG) is not None) and span.flags & IS_REMOTE and not span.flags & 1:
            # The request's caller (Envoy, a client) did not sample: nothing of it will ever arrive.
            set_attr(span, UNRECORDED_PARENT, parent.hex())
            span.parent_span_id = b""


def _missing_callees(items: list[tuple[int, trace_pb2.Span]], unreachable: list[str], answered: bool) -> list[str]:
    """The collector's calls (CLIENT spans that did not fail) without a server span below them, when a process
    that could hold it did not answer (or none answered): that part is lost, not merely unrecorded."""
    if answered and not unreachable:
        return []
    served = {span.parent_span_id for index, span in items if index != 0 and span.kind == SERVER}
    calls = [span for index, span in items if index == 0 and span.kind == CLIENT and span.status.code != ERROR]
    lacking = sorted({span.name for span in calls if span.span_id not in served})
    if not lacking:
        return []
    who = ", ".join(unreachable) if unreachable else "no other process answered"
    return [f"callee of {name}: not collected ({who})" for name in lacking]


def _root(items: list[tuple[int, trace_pb2.Span]]) -> trace_pb2.Span | None:
    roots = [(index, span) for index, span in items if not span.parent_span_id]
    if not roots:
        return None
    return min(roots, key=lambda item: (item[0] != 0, item[1].start_time_unix_nano))[1]


def _mark(span: trace_pb2.Span, names: set[str], missing: list[str]) -> None:
    current = _attr(span, TRIGGER)
    existing = {t for t in current.string_value.split(",") if t} if current is not None else set()
    set_attr(span, TRIGGER, ",".join(sorted(existing | names)))
    if missing:
        set_attr(span, PARTIAL, True)
        set_attr(span, PARTIAL_PROCESSES, list(missing))


def _marker(own: Part, trace_id: bytes, names: set[str], missing: list[str]) -> None:
    """A span standing in for a kept trace's lost root, carrying its marks."""
    assert own.resource is not None
    scope = own.resource.scope_spans.add()
    scope.scope.name = "meshserve.recording"
    span = scope.spans.add()
    span.trace_id = trace_id
    span.span_id = os.urandom(8)
    span.name = COLLECTION_SPAN
    span.kind = trace_pb2.Span.SPAN_KIND_INTERNAL
    starts = [s.start_time_unix_nano for sc in own.resource.scope_spans for s in sc.spans if s.trace_id == trace_id]
    span.start_time_unix_nano = span.end_time_unix_nano = min(starts) if starts else time.time_ns()
    _mark(span, names, missing)
