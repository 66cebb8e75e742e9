"""Whether a kept trace reached the trace store whole (`trace_problems`): for bench.tracing's coverage target and the
retroactive-tracing tests. Imports nothing of the services but the store (tests load tritonclient beside it)."""

from __future__ import annotations

from collections.abc import Iterable

from services.traces.stages import is_envoy
from services.traces.store import TraceStore

# The gateway's stage spans and the service whose server span must be below each (through the batch span, which
# is in this trace or, for a member of another request's batch, linked from that one). The cache's are not required:
# a lookup fails open (a late one is a miss, and the cache may never have run it) and the store is off the path; a
# cache process that lost its part says so in the collection (the trace is then marked partial).
HOPS = {"features": "feature", "model": "model"}
STATUS_ERROR = 2


def trace_problems(store: TraceStore, trace_id: str, services: Iterable[str] = ()) -> list[str]:
    """Why a stored trace is not whole (empty: it is): not found, marked partial, not one tree, or a gateway stage
    whose callee's server span is missing (a stage that failed before reaching its callee excepted); `services`
    must each have spans in it or in the batched calls it waited on."""
    spans = store.spans([trace_id])
    if not spans:
        return ["not in the store"]
    problems = []
    row = store.trace_row(trace_id)
    if row is not None and row.partial:
        problems.append("marked partial")
    ids = {s.span_id for s in spans}
    roots = [s for s in spans if not s.parent_span_id]
    orphans = [s for s in spans if s.parent_span_id and s.parent_span_id not in ids]
    if len(roots) != 1 or orphans:
        problems.append(f"{len(roots)} roots, orphans {sorted(f'{s.service}:{s.name}' for s in orphans)}")
    seen = {s.service for s in spans}
    for stage in (s for s in spans if s.service == "gateway" and s.name in HOPS):
        callee = HOPS[stage.name]
        batches = [s for s in spans if s.parent_span_id == stage.span_id and s.name == f"{stage.name}.batch"]
        batches += [b for b in store.linked_by(trace_id, stage.span_id) if b.trace_id != trace_id]
        reached = False
        for batch in batches:
            around = spans if batch.trace_id == trace_id else store.spans([batch.trace_id])
            seen |= {s.service for s in around}
            by_id = {s.span_id: s for s in around}
            for server in (s for s in around if s.service == callee and s.kind == 2):
                parent, seen_ids = by_id.get(server.parent_span_id), {server.span_id}
                while parent is not None and is_envoy(parent.service, parent.attributes):  # the mesh's hops
                    if parent.span_id in seen_ids:
                        problems.append(f"a cycle of parents through {parent.service}:{parent.name}")
                        break
                    seen_ids.add(parent.span_id)
                    parent = by_id.get(parent.parent_span_id)
                reached = reached or (parent is not None and parent.span_id == batch.span_id)
        failed = stage.status == STATUS_ERROR or any(b.status == STATUS_ERROR for b in batches)
        if not reached and not failed:
            problems.append(f"no {callee} server span under {stage.name}")
    problems += [f"no {service} spans" for service in services if service not in seen]
    return problems
