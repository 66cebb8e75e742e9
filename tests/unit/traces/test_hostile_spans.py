"""Spans no sane exporter sends still leave the trace store writing, found by the RPC fuzzer
(tests/fuzz): an end time of 2**64 - 2 ns (a fixed64 past SQLite's signed 64-bit integers)
made the insert raise OverflowError, which dropped every span written in the same transaction and logged a
traceback for each batch."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from services.traces import writer as writer_module
from services.traces.converters import MAX_TIME_NS, records_from_request
from services.traces.records import SpanRecord
from services.traces.store import TraceStore
from services.traces.writer import SpanWriter
from tests.unit.traces.otlp_requests import pb_span, request


def fuzzed_span() -> trace_service_pb2.ExportTraceServiceRequest:
    """The fuzzer's example: a valid SERVER span whose end time became 18446744073709551614."""
    span = pb_span(1, 1, 2, name="/inference.GRPCInferenceService/ModelInfer")
    span.start_time_unix_nano = 1_700_000_000_000_000_000
    span.end_time_unix_nano = 18446744073709551614
    return request("fuzz", [span])


def test_times_past_int64_are_kept_as_the_largest_time_the_store_holds() -> None:
    (record,) = records_from_request(fuzzed_span())
    assert (record.start_ns, record.end_ns) == (1_700_000_000_000_000_000, MAX_TIME_NS)
    with TraceStore(":memory:") as store:
        assert store.insert([record]) == 1
        (stored,) = store.spans([record.trace_id])
        assert stored.end_ns == MAX_TIME_NS


def test_one_such_span_loses_no_other_span_of_its_batch(tmp_path: Path) -> None:
    writer = SpanWriter(tmp_path / "t.sqlite", max_spans=1000, max_age_s=0)
    # Queued before the thread starts, so that all three are written in one transaction.
    writer.submit(request("model", [pb_span(5, 1)]))
    writer.submit(fuzzed_span())
    writer.submit(request("model", [pb_span(6, 1)]))
    writer.start()
    writer.flush()
    writer.close()
    assert writer.written == 3
    with TraceStore(tmp_path / "t.sqlite") as store:
        assert store.trace_count() == 3


def test_a_request_that_fails_to_convert_ends_neither_the_writer_nor_its_batch_mates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever a request makes conversion raise, only that request is dropped."""
    bad = request("fuzz", [pb_span(9, 1)])

    def convert(req: trace_service_pb2.ExportTraceServiceRequest) -> list[SpanRecord]:
        if req is bad:
            raise ValueError("cannot convert")
        return records_from_request(req)

    monkeypatch.setattr(writer_module, "records_from_request", convert)
    writer = SpanWriter(tmp_path / "t.sqlite", max_spans=1000, max_age_s=0)
    for req in (request("model", [pb_span(5, 1)]), bad, request("model", [pb_span(6, 1)])):
        writer.submit(req)
    writer.start()
    writer.flush()
    writer.submit(request("model", [pb_span(7, 1)]))
    writer.close()
    assert writer.written == 3
