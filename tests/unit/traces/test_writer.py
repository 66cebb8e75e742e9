"""The store's single writer thread: batched writes, a bounded queue, a failure to open reported at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.traces.store import TraceStore
from services.traces.writer import SpanWriter
from tests.unit.traces.otlp_requests import pb_span, request


def test_writer_batches_into_the_store(tmp_path: Path) -> None:
    writer = SpanWriter(tmp_path / "t.sqlite", max_spans=1000, max_age_s=0)
    writer.start()
    for t in range(1, 21):
        assert writer.submit(request("gateway", [pb_span(t, 1), pb_span(t, 2, 1)])) == 0
    writer.flush()
    assert writer.written == 40
    writer.close()
    with TraceStore(tmp_path / "t.sqlite") as store:
        assert store.trace_count() == 20 and store.span_total() == 40


def test_writer_rejects_past_its_queue_bound(tmp_path: Path) -> None:
    writer = SpanWriter(tmp_path / "t.sqlite", max_spans=1000, max_age_s=0, queue_max_spans=3)
    # Not started: nothing drains, so the bound is reached.
    assert writer.submit(request("gateway", [pb_span(1, 1), pb_span(1, 2, 1)])) == 0
    assert writer.submit(request("gateway", [pb_span(2, 1), pb_span(2, 2, 1)])) == 2
    assert writer.rejected == 2


def test_writer_start_fails_on_a_bad_path(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    writer = SpanWriter(tmp_path / "file" / "t.sqlite", max_spans=10, max_age_s=0)
    with pytest.raises(OSError):
        writer.start()


def test_close_writes_what_is_queued(tmp_path: Path) -> None:
    writer = SpanWriter(tmp_path / "t.sqlite", max_spans=1000, max_age_s=0)
    writer.start()
    writer.submit(request("model", [pb_span(5, 1), pb_span(5, 2, 1), pb_span(5, 3, 1)]))
    writer.close()
    assert writer.written == 3
    with TraceStore(tmp_path / "t.sqlite") as store:
        assert store.span_total() == 3
