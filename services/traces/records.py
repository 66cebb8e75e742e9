"""The span record kept per span (one row in the store, its links and events with it), with the OTLP kind and status
codes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KIND_UNSPECIFIED, KIND_INTERNAL, KIND_SERVER, KIND_CLIENT, KIND_PRODUCER, KIND_CONSUMER = range(6)
KIND_NAMES = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2
# The gateway's batched downstream call (`<stage span>.batch`) carries BATCH_MEMBERS and BATCH_ROWS, and one link
# per member request, to that member's stage span, with BATCH_INDEX (its place in the batch).
BATCH_MEMBERS, BATCH_ROWS, BATCH_INDEX = "batch.members", "batch.rows", "batch.index"
# The tier a span was collected in, set on reading when several stores are read as one (`services.traces.tiered`).
TIER = "meshserve.tier"


@dataclass(frozen=True, slots=True)
class SpanLink:
    """An OpenTelemetry span link: the span it points to (lowercase hex ids) and the link's attributes."""

    trace_id: str
    span_id: str
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SpanEvent:
    """An OpenTelemetry span event: its name, time (Unix nanoseconds) and attributes."""

    name: str
    time_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One finished span: ids as lowercase hex ("" for no parent), times in Unix nanoseconds."""

    trace_id: str
    span_id: str
    parent_span_id: str
    service: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    status: int = STATUS_UNSET
    attributes: dict[str, Any] = field(default_factory=dict)
    links: tuple[SpanLink, ...] = ()
    events: tuple[SpanEvent, ...] = ()
    status_message: str = ""

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)
