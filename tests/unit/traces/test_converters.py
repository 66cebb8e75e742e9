"""OTLP request conversion into span records: ids as hex, the resource's service name, attributes as values, links,
events and the status message."""

from __future__ import annotations

from opentelemetry.proto.common.v1 import common_pb2

from services.traces.converters import MAX_TIME_NS, any_value, records_from_request, span_count
from services.traces.records import KIND_SERVER, STATUS_ERROR, SpanEvent, SpanLink
from tests.unit.traces.otlp_requests import kv, pb_link, pb_span, request


def test_records_from_request() -> None:
    req = request("model", [pb_span(7, 1, name="m", **{"batch.size": 4, "ok": True, "x": 0.5}), pb_span(7, 2, 1)])
    req.resource_spans[0].scope_spans[0].spans.append(pb_span(0, 3))  # no trace id: ignored
    assert span_count(req) == 3
    a, b = records_from_request(req)
    assert a.trace_id == f"{7:032x}" and a.span_id == f"{1:016x}" and a.parent_span_id == ""
    assert (a.service, a.name, a.kind, a.status) == ("model", "m", KIND_SERVER, STATUS_ERROR)
    assert (a.start_ns, a.end_ns) == (1000, 1500)
    assert a.attributes == {"batch.size": 4, "ok": True, "x": 0.5}
    assert b.parent_span_id == f"{1:016x}"
    assert a.links == b.links == ()


def test_links_keep_their_span_and_attributes() -> None:
    batch = pb_span(7, 9, 1, name="features.batch", **{"batch.members": 2})
    batch.links.extend([pb_link(7, 1, **{"batch.index": 0}), pb_link(8, 4, **{"batch.index": 1}), pb_link(0, 5)])
    batch.links.append(pb_link(8, 0))  # no span id: not a link to a span
    (record,) = records_from_request(request("gateway", [batch]))
    assert record.links == (
        SpanLink(f"{7:032x}", f"{1:016x}", {"batch.index": 0}),
        SpanLink(f"{8:032x}", f"{4:016x}", {"batch.index": 1}),
    )


def test_a_resource_without_a_service_name() -> None:
    req = request("model", [pb_span(7, 1)])
    del req.resource_spans[0].resource.attributes[:]
    (record,) = records_from_request(req)
    assert record.service == ""


def test_any_value_of_every_kind() -> None:
    nested = common_pb2.AnyValue(
        kvlist_value=common_pb2.KeyValueList(
            values=[
                common_pb2.KeyValue(key="ids", value=common_pb2.AnyValue(bytes_value=b"\x01\xff")),
                common_pb2.KeyValue(
                    key="sizes",
                    value=common_pb2.AnyValue(
                        array_value=common_pb2.ArrayValue(
                            values=[common_pb2.AnyValue(int_value=1), common_pb2.AnyValue(string_value="two")]
                        )
                    ),
                ),
            ]
        )
    )
    assert any_value(nested) == {"ids": "01ff", "sizes": [1, "two"]}
    assert any_value(common_pb2.AnyValue()) is None


def test_events_and_the_status_message_are_kept() -> None:
    span = pb_span(7, 1, name="features")
    span.status.message = "feature service UNAVAILABLE"
    span.events.add(name="retry", time_unix_nano=1200, attributes=[kv("attempt", 2)])
    span.events.add(name="exception", time_unix_nano=2**64 - 1)  # past the year 2262: kept as the latest time
    (record,) = records_from_request(request("gateway", [span]))
    assert record.status_message == "feature service UNAVAILABLE"
    assert record.events == (SpanEvent("retry", 1200, {"attempt": 2}), SpanEvent("exception", MAX_TIME_NS, {}))
