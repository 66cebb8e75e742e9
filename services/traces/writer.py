"""The store's single writer: a thread that converts queued OTLP requests and writes them in batched transactions."""

from __future__ import annotations

import logging
import queue
import threading
from pathlib import Path

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from services.traces.converters import records_from_request, span_count
from services.traces.records import SpanRecord
from services.traces.store import TraceStore

log = logging.getLogger(__name__)
_STOP = object()


class SpanWriter:
    """Accepts Export requests without blocking (bounded by queued spans) and writes them off the event loop.

    Each loop takes everything queued (up to `batch_max_spans` spans) and writes it in one transaction,
    so a burst of Exports costs one fsync-free WAL commit, not one per request.
    """

    def __init__(
        self,
        path: Path,
        max_spans: int,
        max_age_s: float,
        batch_max_spans: int = 5000,
        queue_max_spans: int = 100_000,
    ) -> None:
        self.path = path
        self.max_spans = max_spans
        self.max_age_s = max_age_s
        self.batch_max_spans = batch_max_spans
        self.queue_max_spans = queue_max_spans
        self.written = 0
        self.rejected = 0
        self._queue: queue.Queue[object] = queue.Queue()
        self._pending = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="traces-writer", daemon=True)
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> None:
        """Open the store (in the writer thread) and start writing; raises if the store cannot be opened."""
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def submit(self, request: trace_service_pb2.ExportTraceServiceRequest) -> int:
        """Queue a request; returns how many of its spans were rejected (all of them when the queue is full)."""
        count = span_count(request)
        with self._lock:
            if self._pending + count > self.queue_max_spans:
                self.rejected += count
                return count
            self._pending += count
        self._queue.put((request, count))
        return 0

    def flush(self) -> None:
        """Block until everything queued so far is written."""
        self._queue.join()

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop the thread."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)

    def _convert(self, request: trace_service_pb2.ExportTraceServiceRequest, count: int) -> list[SpanRecord]:
        """The request's records; none when it does not convert (this thread, and the request's batch, go on)."""
        try:
            return records_from_request(request)
        except Exception:
            log.exception("an Export request of %d spans did not convert; dropped", count)
            return []

    def _run(self) -> None:
        try:
            store = TraceStore(self.path, self.max_spans, self.max_age_s)
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            stopping = False
            while not stopping:
                item = self._queue.get()
                items = [item]
                spans = item[1] if isinstance(item, tuple) else 0
                while spans < self.batch_max_spans:
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    items.append(more)
                    spans += more[1] if isinstance(more, tuple) else 0
                stopping = any(it is _STOP for it in items)
                records: list[SpanRecord] = []
                for it in items:
                    if isinstance(it, tuple):
                        records.extend(self._convert(it[0], it[1]))
                try:
                    self.written += store.insert(records)
                except Exception:
                    log.exception("writing %d spans to %s failed; dropped", len(records), self.path)
                finally:
                    with self._lock:
                        self._pending -= spans
                    for _ in items:
                        self._queue.task_done()
        finally:
            store.close()
