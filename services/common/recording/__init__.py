"""Always-on, cheap span recording with retroactive collection: the OpenTelemetry tracing API answered by lightweight
spans that end in a bounded in-memory buffer per process, keyed by trace id, with no SDK span objects and no OTLP
encoding on the serving path.

Every span the services create (the gRPC server span of each RPC, `child_span`'s stage spans, the gateway's batch
spans, the model's queue-wait and forward spans) is a `RecordedSpan` once `Recorder` is the global tracer
provider. A span of a trace whose caller sampled it (the W3C sampled flag) is exported as head sampling would;
every other span waits in the buffer, the oldest traces evicted whole, until the process's collector or another
process's collector asks for its trace, or until it rolls over. The edge (the gateway) decides at the end of each
request whether its trace is kept (`Recorder.edge`); a kept trace's spans here are pinned at once, so this process
never loses its own part after the decision.

The modules, by job: `spans` (the span, the attribute names, the current span), `buffer` (the bounded buffer),
`provider` (the Recorder: tracers, where spans go, the keep decision), `propagation` (`x-meshserve-parent` and the
traceparent), `otlp` (spans as OTLP, the exporter), `assemble` (a collected trace made whole or marked partial),
`collect` (the collector), `admin` (the admin HTTP endpoint other collectors ask), `metrics` (Prometheus),
`settings` (`MESHSERVE_TRACING_*`). Outside this package, only the names below are used; the rest is internal.
"""

from services.common.recording.admin import MAX_IDS, AdminServer, JsonAdmin, trace_id_of
from services.common.recording.collect import Collector
from services.common.recording.metrics import RecordingMetrics
from services.common.recording.otlp import OtlpExporter
from services.common.recording.propagation import PARENT_HEADER, ParentPropagator, parse_traceparent
from services.common.recording.provider import Recorder, RecordingTracer, recorder
from services.common.recording.settings import RecordingSettings
from services.common.recording.spans import (
    ACCESS_LOG,
    DEGRADED,
    PIPELINE,
    TRIGGER,
    RecordedSpan,
    current_span,
    enter,
    leave,
)

__all__ = [
    "ACCESS_LOG",
    "DEGRADED",
    "MAX_IDS",
    "PARENT_HEADER",
    "PIPELINE",
    "TRIGGER",
    "AdminServer",
    "Collector",
    "JsonAdmin",
    "OtlpExporter",
    "ParentPropagator",
    "RecordedSpan",
    "Recorder",
    "RecordingMetrics",
    "RecordingSettings",
    "RecordingTracer",
    "current_span",
    "enter",
    "leave",
    "parse_traceparent",
    "recorder",
    "trace_id_of",
]
