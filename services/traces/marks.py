"""The trace-level marks a search filters on (pipeline, triggers, degraded, partial, the root's gRPC code), read from
the attributes of a trace's spans as they arrive.

Attributes (any span of the trace may carry them; the recorder puts them on the root span):

* `meshserve.pipeline` (str): the pipeline the request was for. Without it, `cache.pipeline` (the cache service's
  lookup names the pipeline in passing) is the trace's pipeline hint.
* `meshserve.trigger` (str, comma-separated str, or list of str): why the trace was kept (`latency`, `error`,
  `degraded`, `sampled`, `baseline`, or a service's own, e.g. `queue_wait`); a trace keeps every trigger seen.
* `meshserve.degraded` (str, or true): the degradation reason of the answer (`features_degraded`, ...).
* `meshserve.partial` (true): a process's buffer rolled over before the trace was collected, so some of its spans
  are missing (marked, never silently incomplete).
* `rpc.grpc.status_code` (OTel SDK, int) or `grpc.status_code` (Envoy, str) on a span with no parent id: the code
  the trace's request was answered with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from services.traces.records import SpanRecord

PIPELINE = "meshserve.pipeline"
TRIGGER = "meshserve.trigger"
DEGRADED = "meshserve.degraded"
PARTIAL = "meshserve.partial"
PIPELINE_HINTS = ("cache.pipeline",)
GRPC_CODES = ("rpc.grpc.status_code", "grpc.status_code")
TRIGGERS = ("latency", "error", "degraded", "sampled", "baseline")
GRPC_CODE_NAMES = (
    "OK CANCELLED UNKNOWN INVALID_ARGUMENT DEADLINE_EXCEEDED NOT_FOUND ALREADY_EXISTS PERMISSION_DENIED "
    "RESOURCE_EXHAUSTED FAILED_PRECONDITION ABORTED OUT_OF_RANGE UNIMPLEMENTED INTERNAL UNAVAILABLE DATA_LOSS "
    "UNAUTHENTICATED"
).split()
MAX_MARK_CHARS = 128  # a mark is a short name; a hostile exporter's megabyte string is cut, not indexed


@dataclass(slots=True)
class Marks:
    """What one batch of spans says about its trace (None / empty: nothing said)."""

    pipeline: str | None = None
    pipeline_hint: str | None = None
    triggers: set[str] = field(default_factory=set)
    degraded: str | None = None
    partial: bool = False
    code: int | None = None

    def __bool__(self) -> bool:
        return bool(self.pipeline or self.pipeline_hint or self.triggers or self.degraded or self.partial) or (
            self.code is not None
        )


def code_name(code: int | None) -> str | None:
    """`RESOURCE_EXHAUSTED` for 8; None for None; the number as text past the known codes."""
    if code is None:
        return None
    return GRPC_CODE_NAMES[code] if 0 <= code < len(GRPC_CODE_NAMES) else str(code)


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    text = str(value).strip()[:MAX_MARK_CHARS]
    return text or None


def triggers_of(value: Any) -> set[str]:
    """The trigger names in an attribute value: `latency`, `latency,degraded` or `["latency", "degraded"]`."""
    if isinstance(value, list):
        items = [str(v) for v in value if not isinstance(v, (dict, list))]
    elif value is None or isinstance(value, dict):
        items = []
    else:
        items = str(value).split(",")
    return {t for t in map(_text, items) if t}


def _code(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _true(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() in {"true", "1", "yes"}) or value == 1


def read(attributes: Mapping[str, Any], root: bool, into: Marks) -> None:
    """Add what one span's attributes say to `into` (`root`: the span has no parent id)."""
    if PIPELINE in attributes and into.pipeline is None:
        into.pipeline = _text(attributes[PIPELINE])
    for hint in PIPELINE_HINTS:
        if hint in attributes and into.pipeline_hint is None:
            into.pipeline_hint = _text(attributes[hint])
    if TRIGGER in attributes:
        into.triggers |= triggers_of(attributes[TRIGGER])
    if DEGRADED in attributes and into.degraded is None:
        value = attributes[DEGRADED]
        into.degraded = "degraded" if value is True else None if value is False else _text(value)
    if PARTIAL in attributes and _true(attributes[PARTIAL]):
        into.partial = True
    if root:
        for key in GRPC_CODES:
            if key in attributes and (code := _code(attributes[key])) is not None:
                into.code = code
                break


def marks_by_trace(records: Iterable[SpanRecord]) -> dict[str, Marks]:
    """The marks of each trace among `records` that says anything."""
    out: dict[str, Marks] = {}
    for record in records:
        marks = out.get(record.trace_id)
        if marks is None:
            marks = out[record.trace_id] = Marks()
        read(record.attributes, not record.parent_span_id, marks)
    return {trace_id: marks for trace_id, marks in out.items() if marks}


def join_triggers(triggers: Iterable[str]) -> str:
    """Triggers as the store keeps them: `,baseline,latency,` (sorted; `,name,` matches one exactly), '' for none."""
    names = sorted(set(triggers))
    return f",{','.join(names)}," if names else ""


def split_triggers(stored: str | None) -> tuple[str, ...]:
    """The store's `,a,b,` back as ("a", "b")."""
    return tuple(t for t in (stored or "").split(",") if t)
