"""Per-request model spans, recorded after the fact: time waiting in the batch queue and the batch forward.

A batch serves several requests (each with its own trace), so every request gets its own
`model.queue_wait` and `model.forward` spans under its RPC's span, with the batch's size as an attribute.
Nothing is captured when tracing is off. Under always-on recording (services/common/recording/) every request's
spans are recorded, and a wait longer than MESHSERVE_TRACING_QUEUE_WAIT_MS keeps its trace (trigger `queue_wait`).
"""

from __future__ import annotations

import time

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider

from services.common.recording import TRIGGER, RecordedSpan, Recorder, RecordingSettings

QUEUE_WAIT = "queue_wait"
_tracer: trace.Tracer | None = None
_queue_wait_ns: int | None = None  # the trigger's bound, read with the tracer


def capture() -> Context | None:
    """The caller's trace context when its span is sampled or recorded (None costs nothing later)."""
    global _tracer, _queue_wait_ns
    current = trace.get_current_span()
    if type(current) is not RecordedSpan and not current.get_span_context().trace_flags.sampled:
        return None  # unsampled (or tracing off): nothing to record
    provider = trace.get_tracer_provider()
    if not isinstance(provider, (TracerProvider, Recorder)):
        return None
    if _tracer is None:
        _tracer = provider.get_tracer("meshserve.model")
        bound = RecordingSettings().queue_wait_ms if isinstance(provider, Recorder) else None
        _queue_wait_ns = int(bound * 1e6) if bound else None
    return otel_context.get_current()


def record(
    ctx: Context | None, enqueued_ns: int, started_ns: int, forward_ns: int, batch_rows: int, batch_requests: int
) -> None:
    """Queue-wait and forward spans of one request (perf_counter_ns times, converted to epoch)."""
    if ctx is None or _tracer is None:
        return
    to_epoch = time.time_ns() - time.perf_counter_ns()
    attributes = {"batch.size": batch_rows, "batch.requests": batch_requests}
    wait = _tracer.start_span("model.queue_wait", context=ctx, start_time=enqueued_ns + to_epoch)
    if _queue_wait_ns is not None and started_ns - enqueued_ns > _queue_wait_ns and isinstance(wait, RecordedSpan):
        wait.set_attribute(TRIGGER, QUEUE_WAIT)
        wait.recorder.trigger(wait.trace_id, QUEUE_WAIT)
    wait.end(end_time=started_ns + to_epoch)
    forward = _tracer.start_span("model.forward", context=ctx, start_time=started_ns + to_epoch, attributes=attributes)
    forward.end(end_time=started_ns + forward_ns + to_epoch)
