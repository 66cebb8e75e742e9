"""Synthetic span records for the trace tests: one pipeline request through Envoy, gateway, feature and model, and
requests whose feature calls went as one batched call."""

from __future__ import annotations

import dataclasses
import itertools

from services.traces.records import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, STATUS_UNSET, SpanLink, SpanRecord

MS = 1_000_000
_ids = itertools.count(1)


def span(
    trace: str,
    parent: str,
    service: str,
    name: str,
    start_ms: float,
    end_ms: float,
    kind: int = KIND_INTERNAL,
    status: int = STATUS_UNSET,
    base_ns: int = 1_700_000_000_000_000_000,
    **attributes: object,
) -> SpanRecord:
    """A span at [start_ms, end_ms] after `base_ns`, with a fresh span id."""
    return SpanRecord(
        trace_id=trace,
        span_id=f"{next(_ids):016x}",
        parent_span_id=parent,
        service=service,
        name=name,
        kind=kind,
        start_ns=base_ns + int(start_ms * MS),
        end_ns=base_ns + int(end_ms * MS),
        status=status,
        attributes=dict(attributes),
    )


def pipeline(
    n: int, online_ms: float = 1.0, forward_ms: float = 1.0, base_ns: int = 1_700_000_000_000_000_000
) -> list[SpanRecord]:
    """Trace number `n`: ingress -> gateway (cache, features -> feature service, model -> model service).

    Fixed costs: 0.1 ms per Envoy hop side, 0.2 ms gateway own time, 0.3 ms per network leg, cache 0.5 ms,
    static lookup 0.2 ms, request transforms 0.1 ms, queue wait 0.2 ms.
    """
    t = f"{n:032x}"
    base = base_ns + n * 1000 * MS
    out: list[SpanRecord] = []

    def add(
        parent: SpanRecord | None,
        service: str,
        name: str,
        a: float,
        b: float,
        kind: int = KIND_INTERNAL,
        **attrs: object,
    ) -> SpanRecord:
        s = span(t, parent.span_id if parent else "", service, name, a, b, kind, base_ns=base, **attrs)
        out.append(s)
        return s

    feature_ms = 0.2 + online_ms + 0.2 + 0.1 + 0.1  # rpc own 0.2 + online + static + request + rpc tail 0.1
    model_ms = 0.1 + 0.2 + forward_ms + 0.1
    gateway_ms = 0.1 + 0.5 + 0.3 + feature_ms + 0.3 + 0.3 + model_ms + 0.3 + 0.1
    total = 0.1 + 0.1 + gateway_ms + 0.1 + 0.1
    ingress = add(None, "meshserve-ingress", "127.0.0.1:8000", 0, total, KIND_SERVER, component="proxy")
    upstream = add(ingress, "meshserve-ingress", "router gateway egress", 0.1, total - 0.1, KIND_CLIENT)
    g0 = 0.2
    gw = add(upstream, "gateway", "inference.GRPCInferenceService/ModelInfer", g0, g0 + gateway_ms, KIND_SERVER)
    c = g0 + 0.1
    add(gw, "gateway", "cache.lookup", c, c + 0.5)
    f0 = c + 0.5
    features = add(gw, "gateway", "features", f0, f0 + 0.3 + feature_ms + 0.3)
    fs = f0 + 0.3
    frpc = add(features, "feature", "meshserve.feature.FeatureService/Compute", fs, fs + feature_ms, KIND_SERVER)
    add(frpc, "feature", "feature.online_lookup", fs + 0.2, fs + 0.2 + online_ms)
    add(frpc, "feature", "feature.static_lookup", fs + 0.2 + online_ms, fs + 0.4 + online_ms)
    add(frpc, "feature", "feature.request_transforms", fs + 0.4 + online_ms, fs + 0.5 + online_ms)
    m0 = f0 + 0.3 + feature_ms + 0.3
    model = add(gw, "gateway", "model", m0, m0 + 0.3 + model_ms + 0.3)
    ms0 = m0 + 0.3
    mrpc = add(model, "model", "inference.GRPCInferenceService/ModelInfer", ms0, ms0 + model_ms, KIND_SERVER)
    add(mrpc, "model", "model.queue_wait", ms0 + 0.1, ms0 + 0.3)
    add(mrpc, "model", "model.forward", ms0 + 0.3, ms0 + 0.3 + forward_ms, **{"batch.size": 4})
    return out


def batched(
    members: int = 2, online_ms: float = 4.0, late_ms: float = 0.0, base_ns: int = 1_700_000_000_000_000_000
) -> list[list[SpanRecord]]:
    """`members` requests whose feature calls went downstream as one batched call, each request its own trace.

    Member i arrives `i * late_ms` after the first (its ingress, gateway and `features` spans start that much
    later); the batch leaves 0.1 ms after the last one joined and answers them all. The `features.batch` span
    (`batch.members`, `batch.rows`, a link to every member's `features` span with its `batch.index`) and its subtree
    (the feature sidecar's spans, the feature service's) are in the first member's trace, under its `features` span.
    Own times per member: ingress 0.2 ms, gateway 0.4 ms, cache lookup 0.5 ms, features its wait for the batch to
    leave + 0.1 ms after the answer, model 0.4 ms, its rpc 0.6 ms; the batched call: gateway 0.2 ms, Envoy
    0.2 + 0.2 ms, feature rpc 0.6 ms, `online_ms` lookup.
    """
    start = 0.8 + (members - 1) * late_ms + 0.1
    end = start + 0.6 + online_ms + 0.6
    total = end + 1.4

    def under(parent: SpanRecord, service: str, name: str, a: float, b: float, kind: int = KIND_INTERNAL) -> SpanRecord:
        return span(parent.trace_id, parent.span_id, service, name, a, b, kind, base_ns=base_ns)

    traces: list[list[SpanRecord]] = []
    stage_spans: list[SpanRecord] = []
    for i in range(members):
        d = i * late_ms
        ingress = span(
            f"{0xBA7C4 + i:032x}",
            "",
            "meshserve-ingress",
            "127.0.0.1:8000",
            d,
            total,
            KIND_SERVER,
            base_ns=base_ns,
            component="proxy",
        )
        gw = under(ingress, "gateway", "inference.GRPCInferenceService/ModelInfer", d + 0.1, total - 0.1, KIND_SERVER)
        lookup = under(gw, "gateway", "cache.lookup", d + 0.2, d + 0.7)
        features = under(gw, "gateway", "features", d + 0.8, end + 0.1)
        model = under(gw, "gateway", "model", end + 0.2, end + 1.2)
        infer = under(model, "model", "inference.GRPCInferenceService/ModelInfer", end + 0.4, end + 1.0, KIND_SERVER)
        stage_spans.append(features)
        traces.append([ingress, gw, lookup, features, model, infer])
    links = tuple(SpanLink(s.trace_id, s.span_id, {"batch.index": i}) for i, s in enumerate(stage_spans))
    batch = under(stage_spans[0], "gateway", "features.batch", start, end, KIND_CLIENT)
    batch = dataclasses.replace(batch, links=links, attributes={"batch.members": members, "batch.rows": members})
    sidecar = under(batch, "feature-sidecar", "feature:8002", start + 0.1, end - 0.1, KIND_SERVER)
    upstream = under(sidecar, "feature-sidecar", "router feature egress", start + 0.2, end - 0.2, KIND_CLIENT)
    rpc = under(upstream, "feature", "meshserve.feature.FeatureService/Compute", start + 0.3, end - 0.3, KIND_SERVER)
    online = under(rpc, "feature", "feature.online_lookup", start + 0.5, start + 0.5 + online_ms)
    traces[0] += [batch, sidecar, upstream, rpc, online]
    return traces
