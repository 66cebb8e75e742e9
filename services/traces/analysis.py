"""Latency analysis over span records (pure, no I/O): trace trees, self time per stage, critical path, hotspot.

Definitions (times in nanoseconds; a trace's spans may come from clocks of different processes):

* A trace's **end-to-end time** is from its earliest span start to its latest span end.
* A span's **self time** is its duration minus the union of its children's intervals, each clipped to the span
  (overlapping children count once; children outside the span do not count).
* A **stage** (see `services.traces.stages`) takes, per trace, the sum of the self times of its spans there.
* A **batched call** does one downstream call for several requests: the gateway's `<stage span>.batch` span (a span
  with attribute `batch.members`, or links carrying `batch.index`), a child of the first member's stage span, with a
  link to every member's stage span. Its subtree (Envoy's spans, the callee and its inner spans) lies in the first
  member's trace only, where it counts as it is. In every other member's trace, the part of the member span's self
  time that falls inside the batch span's interval is **attributed** to the stages of the batch span's subtree, split
  in the proportions of that subtree's self times per stage (`attribute_batches`); what lies outside it (waiting
  for the batch to form, taking the answer apart) stays the member span's own. So a member's breakdown reads like
  the first member's, and a shared hop's time counts once per member (each waited for all of it). This needs the
  batch span's trace among the spans assembled (`meshserve traces` loads it through the store's links); without it
  the member span keeps its self time. Waterfalls and critical paths show the spans as they are.
* A stage's **share** is the sum of its self time over the traces considered divided by the sum of their
  end-to-end times; its **share of p99** is the same over only the **p99-slowest traces**: those whose
  end-to-end time is at or above the p99 (nearest rank) of the traces considered, so at least the slowest one.
  When no spans of a trace overlap their siblings the shares add up to 100%; concurrent children (each
  counted in full in its own subtree) can make the sum exceed it.
* The **hotspot** is the stage with the largest share of p99 (ties: larger overall share, then alphabetical);
  it is printed as `hotspot: feature.online_lookup (71% of p99)`, the percentage rounded to an integer.
* **Slow against typical**: the typical traces are those between the p25 and the p75 (nearest rank, both inclusive)
  of the traces considered, the slow ones those at or above their p90 and longer than the p75 (so the two never
  overlap, and many equal durations make no trace slow). Per stage, the mean self time
  per trace of each group (a trace without the stage counts 0) and the difference, slow minus typical: the stages
  with the largest differences are where the slow traces' extra time went (`compare`).
* **Across tiers** (spans read from several stores, each labelled with its tier, `records.TIER`): the stages of
  spans of another tier than the home one are prefixed with it (`cloud:gateway.model`). A span whose child was
  collected in another tier is the caller's end of the **WAN hop**: its stage is `wan`, its self time its duration
  minus its other-tier children's durations (unclipped, so a clock offset between the tiers does not move it), and
  so are the Envoy spans of its tier directly above it (the egress listener's server span over its upstream span,
  where the emulated WAN delay is spent): their self times add up to the egress span's duration minus the other
  tier's ingress span's. A home-tier `gateway.cloud` span (the edge gateway's call to the cloud) with no other-tier
  span under it, nor shared from a batched call with one, is a call whose **cloud side is missing** (its store not
  read, its spans not kept, or the call failed): it stays whole as `gateway.cloud` (`Trace.remote_missing`).
* The **critical path** of a trace walks back from the end of the root: at each span the child that ended last
  (before the cursor) is on the path, the cursor moves to that child's start, and so on; the gaps are the
  span's own time. Each span on the path gets the time it was the critical one (the times add up to the root's
  duration). Spans whose parent is missing are not on it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from services.traces.records import BATCH_INDEX, BATCH_MEMBERS, STATUS_ERROR, TIER, SpanRecord
from services.traces.stages import CLOUD_CALL, WAN, is_envoy, is_remote, stage_name, tiered


@dataclass(eq=False)
class Node:
    """A span in its trace tree, with its stage and self time."""

    span: SpanRecord
    stage: str
    children: list[Node] = field(default_factory=list)
    self_ns: int = 0
    orphan: bool = False  # has a parent id whose span is not (yet) in the trace
    # The part of self_ns spent waiting on batched calls of other traces, by the stage it is attributed to.
    shared: dict[str, int] = field(default_factory=dict)


@dataclass(eq=False)
class Trace:
    """One assembled trace: its root nodes (spans without a parent here), ordered by start."""

    trace_id: str
    roots: list[Node]
    nodes: list[Node]

    @property
    def start_ns(self) -> int:
        return min(n.span.start_ns for n in self.nodes)

    @property
    def end_ns(self) -> int:
        return max(n.span.end_ns for n in self.nodes)

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)

    @property
    def root(self) -> Node:
        """The first true root (no parent id) or, if none has arrived, the earliest orphan."""
        true_roots = [r for r in self.roots if not r.orphan]
        return (true_roots or self.roots)[0]

    @property
    def complete(self) -> bool:
        """One root and no span whose parent is missing."""
        return len(self.roots) == 1 and not self.roots[0].orphan

    @property
    def error(self) -> bool:
        return any(n.span.status == STATUS_ERROR for n in self.nodes)

    def walk(self) -> Iterable[tuple[Node, int]]:
        """(node, depth) depth-first, children by start time."""
        stack = [(r, 0) for r in reversed(self.roots)]
        while stack:
            node, depth = stack.pop()
            yield node, depth
            stack.extend((c, depth + 1) for c in reversed(node.children))

    @property
    def remote_missing(self) -> int:
        """How many of its calls to the cloud tier have no span of the cloud side (see the module docstring)."""
        return sum(1 for n in self.nodes if n.stage == CLOUD_CALL and not _reaches_remote(n))

    def stage_self_ns(self) -> dict[str, int]:
        """Self time per stage in this trace, a member span's shared part under the batch subtree's stages."""
        out: dict[str, int] = defaultdict(int)
        for node in self.nodes:
            out[node.stage] += node.self_ns - sum(node.shared.values())
            for stage, ns in node.shared.items():
                out[stage] += ns
        return dict(out)


def union_ns(intervals: Iterable[tuple[int, int]], lo: int, hi: int) -> int:
    """Total length of the union of `intervals`, each clipped to [lo, hi]."""
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in intervals)
    total, cur_a, cur_b = 0, None, None
    for a, b in clipped:
        if b <= a:
            continue
        if cur_b is None or a > cur_b:
            if cur_b is not None and cur_a is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None and cur_a is not None:
        total += cur_b - cur_a
    return total


def self_time_ns(span: SpanRecord, children: Sequence[SpanRecord]) -> int:
    """The span's duration minus the union of its children's intervals clipped to it."""
    covered = union_ns(((c.start_ns, c.end_ns) for c in children), span.start_ns, span.end_ns)
    return max(0, span.duration_ns - covered)


def span_tier(span: SpanRecord) -> str | None:
    """The tier the span was collected in, when its store was read as one of several (`records.TIER`)."""
    tier = span.attributes.get(TIER)
    return tier if isinstance(tier, str) and tier else None


def assemble(spans: Iterable[SpanRecord], home: str | None = None) -> list[Trace]:
    """Trace trees from spans in any order (duplicates ignored, missing parents make extra roots), by start, with
    the batched calls among them attributed to their members in the other traces (`attribute_batches`). Spans of
    another tier than `home` get their stages prefixed, and the hops between tiers are `wan` (module docstring)."""
    by_trace: dict[str, dict[str, Node]] = defaultdict(dict)
    for span in spans:
        if not span.trace_id:
            continue
        stage = tiered(stage_name(span.service, span.name, span.kind, span.attributes), span_tier(span), home)
        by_trace[span.trace_id].setdefault(span.span_id, Node(span, stage))
    traces: list[Trace] = []
    for trace_id, nodes in by_trace.items():
        roots: list[Node] = []
        parents: dict[int, Node] = {}
        for node in nodes.values():
            parent_id = node.span.parent_span_id
            parent = nodes.get(parent_id) if parent_id and parent_id != node.span.span_id else None
            if parent is None:
                node.orphan = bool(parent_id)
                roots.append(node)
            else:
                parent.children.append(node)
                parents[id(node)] = parent
        ordered = list(nodes.values())
        for node in ordered:
            node.children.sort(key=lambda n: (n.span.start_ns, n.span.span_id))
            node.self_ns = self_time_ns(node.span, [c.span for c in node.children])
        mark_wan(ordered, parents)
        roots.sort(key=lambda n: (n.orphan, n.span.start_ns, n.span.span_id))
        traces.append(Trace(trace_id, roots, ordered))
    traces.sort(key=lambda t: (t.start_ns, t.trace_id))
    attribute_batches(traces)
    return traces


def mark_wan(nodes: Iterable[Node], parents: dict[int, Node]) -> int:
    """Make each span with a child of another tier, and the Envoy spans of its tier directly above it, the stage
    `wan`, the caller's self time its duration minus its other-tier children's (module docstring); returns how many
    hops it found."""
    hops = 0
    for node in nodes:
        tier = span_tier(node.span)
        remote = [c for c in node.children if tier is not None and span_tier(c.span) not in (None, tier)]
        if not remote:
            continue
        hops += 1
        local = [c for c in node.children if c not in remote]
        covered = union_ns(((c.span.start_ns, c.span.end_ns) for c in local), node.span.start_ns, node.span.end_ns)
        lo, hi = min(c.span.start_ns for c in remote), max(c.span.end_ns for c in remote)
        covered += union_ns(((c.span.start_ns, c.span.end_ns) for c in remote), lo, hi)
        node.self_ns = max(0, node.span.duration_ns - covered)
        node.stage = WAN
        above = parents.get(id(node))
        while above is not None and span_tier(above.span) == tier and _is_envoy(above):
            above.stage = WAN
            above = parents.get(id(above))
    return hops


def _is_envoy(node: Node) -> bool:
    return is_envoy(node.span.service, node.span.attributes)


def _reaches_remote(node: Node) -> bool:
    """Whether a span of another tier (or a WAN hop) is under the node, or in a batched call it was part of."""
    if any(is_remote(stage) for stage in node.shared):
        return True
    stack = list(node.children)
    while stack:
        n = stack.pop()
        if is_remote(n.stage):
            return True
        stack.extend(n.children)
    return False


def is_batch(span: SpanRecord) -> bool:
    """Whether the span is a batched call: it has links and says so (`batch.members`, or `batch.index` on links)."""
    return bool(span.links) and (
        BATCH_MEMBERS in span.attributes or any(BATCH_INDEX in link.attributes for link in span.links)
    )


def members(span: SpanRecord) -> int:
    """How many requests a batched call served: its `batch.members`, or its links if more (an exporter's link limit,
    128 by default in the OTel SDK, may have dropped some links, never members)."""
    said = span.attributes.get(BATCH_MEMBERS)
    return max(len(span.links), said if isinstance(said, int) and not isinstance(said, bool) else 0)


def free_intervals(node: Node) -> list[tuple[int, int]]:
    """The parts of the node's span that none of its children covers (its self time as intervals), in order."""
    lo, hi = node.span.start_ns, node.span.end_ns
    out: list[tuple[int, int]] = []
    cursor = lo
    for a, b in sorted((max(c.span.start_ns, lo), min(c.span.end_ns, hi)) for c in node.children):
        if b <= a:
            continue
        if a > cursor:
            out.append((cursor, a))
        cursor = max(cursor, b)
    if hi > cursor:
        out.append((cursor, hi))
    return out


def subtree_self_ns(node: Node) -> dict[str, int]:
    """Self time per stage of the node and all its descendants."""
    out: dict[str, int] = defaultdict(int)
    stack = [node]
    while stack:
        n = stack.pop()
        out[n.stage] += n.self_ns
        stack.extend(n.children)
    return dict(out)


def split_ns(total: int, weights: dict[str, int]) -> dict[str, int]:
    """`total` in parts proportional to `weights` (positive sum), the parts adding up to it exactly (the leftover
    nanoseconds go to the largest remainders)."""
    whole = sum(weights.values())
    parts = {stage: total * w // whole for stage, w in weights.items()}
    leftover = total - sum(parts.values())
    by_remainder = sorted(weights, key=lambda stage: (-(total * weights[stage] % whole), stage))
    for stage in by_remainder[:leftover]:
        parts[stage] += 1
    return {stage: ns for stage, ns in parts.items() if ns}


def attribute_batches(traces: Sequence[Trace]) -> int:
    """Set `shared` on every member span that a batched call of another trace among `traces` links to (see the
    module docstring); returns how many member spans got a share. Several batched calls of one member (its rows in
    more than one batch) each take the member's self time inside their interval that an earlier one has not taken."""
    nodes = {(n.span.trace_id, n.span.span_id): n for t in traces for n in t.nodes}
    waited_on: dict[tuple[str, str], dict[int, Node]] = defaultdict(dict)
    for trace in traces:
        for node in trace.nodes:
            if is_batch(node.span):
                for link in node.span.links:
                    if link.trace_id != node.span.trace_id:  # in its own trace the subtree is already there
                        waited_on[(link.trace_id, link.span_id)][id(node)] = node
    attributed = 0
    for key, batches in waited_on.items():
        member = nodes.get(key)
        if member is None:
            continue
        free = free_intervals(member)
        shared: dict[str, int] = defaultdict(int)
        for batch in sorted(batches.values(), key=lambda n: (n.span.start_ns, n.span.span_id)):
            lo, hi = batch.span.start_ns, batch.span.end_ns
            inside = sum(max(0, min(b, hi) - max(a, lo)) for a, b in free)
            free = [piece for a, b in free for piece in ((a, min(b, lo)), (max(a, hi), b)) if piece[0] < piece[1]]
            weights = {stage: ns for stage, ns in subtree_self_ns(batch).items() if ns > 0} or {batch.stage: 1}
            for stage, ns in split_ns(inside, weights).items():
                shared[stage] += ns
        member.shared = dict(shared)
        attributed += bool(member.shared)
    return attributed


def select(traces: Sequence[Trace], last: int | None = None, since_ns: int | None = None) -> list[Trace]:
    """The traces started at or after `since_ns`, then the `last` most recent of them (by start)."""
    chosen = [t for t in traces if since_ns is None or t.start_ns >= since_ns]
    chosen.sort(key=lambda t: (t.start_ns, t.trace_id))
    if last is not None:
        chosen = chosen[-last:] if last > 0 else []
    return chosen


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of non-empty `values`."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True)
class PathStep:
    """A span on the critical path and the time it was the critical one."""

    stage: str
    span_id: str
    depth: int
    critical_ns: int


def critical_path(trace: Trace) -> list[PathStep]:
    """The critical path from the trace's root, in nesting order (see the module docstring)."""
    totals: dict[str, int] = defaultdict(int)
    order: list[tuple[Node, int]] = []

    def visit(node: Node, end: int, depth: int) -> None:
        order.append((node, depth))
        lo = node.span.start_ns
        cursor = min(node.span.end_ns, end)
        children = sorted(node.children, key=lambda c: min(c.span.end_ns, cursor), reverse=True)
        for child in children:
            c_end = min(child.span.end_ns, cursor)
            c_start = max(child.span.start_ns, lo)
            if c_end <= c_start or c_start >= cursor:
                continue
            totals[node.span.span_id] += cursor - c_end
            visit(child, c_end, depth + 1)
            cursor = c_start
            if cursor <= lo:
                break
        totals[node.span.span_id] += max(0, cursor - lo)

    root = trace.root
    visit(root, root.span.end_ns, 0)
    steps = [PathStep(n.stage, n.span.span_id, d, totals[n.span.span_id]) for n, d in order]
    # Nesting order: a parent before its children, children on the path by start time.
    position = {node.span.span_id: i for i, (node, _) in enumerate(trace.walk())}
    return sorted(steps, key=lambda s: position.get(s.span_id, -1))


@dataclass(frozen=True)
class StageStats:
    """One stage over the traces considered (self times per trace in which it occurs)."""

    stage: str
    traces: int
    self_p50_ns: float
    self_p99_ns: float
    share: float
    p99_share: float


@dataclass(frozen=True)
class Breakdown:
    """The latency breakdown of a set of traces."""

    traces: list[Trace]
    e2e_p50_ns: float
    e2e_p99_ns: float
    p99_traces: list[Trace]
    stages: list[StageStats]
    slowest: list[tuple[Trace, list[PathStep]]]

    @property
    def hotspot(self) -> StageStats | None:
        return self.stages[0] if self.stages else None

    @property
    def remote_missing(self) -> int:
        """How many of the traces call the cloud tier without its side collected (`Trace.remote_missing`)."""
        return sum(1 for t in self.traces if t.remote_missing)


def missing_line(missing: int, traces: int | None = None) -> str | None:
    """What a report says when `missing` of `traces` traces call the cloud tier without its spans (`traces` None: of
    one trace, its calls); None if none."""
    if not missing:
        return None
    where = "" if traces is None else f" in {missing} of {traces} traces"
    return (
        f"cloud side missing{where}: {CLOUD_CALL} is the whole call, no {WAN} stage "
        "(the cloud's trace store not read, its spans not kept, or the call failed)"
    )


def breakdown(traces: Sequence[Trace], slowest: int = 3) -> Breakdown:
    """Stage statistics, the p99-slowest traces' shares, and the critical paths of the `slowest` traces."""
    traces = list(traces)
    if not traces:
        return Breakdown([], 0.0, 0.0, [], [], [])
    durations = [t.duration_ns for t in traces]
    p99 = percentile(durations, 99)
    p99_traces = [t for t in traces if t.duration_ns >= p99]
    per_trace = [t.stage_self_ns() for t in traces]
    p99_ids = {id(t) for t in p99_traces}
    total_e2e = sum(durations) or 1
    total_p99 = sum(t.duration_ns for t in p99_traces) or 1
    by_stage: dict[str, list[int]] = defaultdict(list)
    p99_sum: dict[str, int] = defaultdict(int)
    for trace, selfs in zip(traces, per_trace, strict=True):
        for stage, ns in selfs.items():
            by_stage[stage].append(ns)
            if id(trace) in p99_ids:
                p99_sum[stage] += ns
    stats = [
        StageStats(
            stage,
            len(values),
            percentile(values, 50),
            percentile(values, 99),
            sum(values) / total_e2e,
            p99_sum.get(stage, 0) / total_p99,
        )
        for stage, values in by_stage.items()
    ]
    stats.sort(key=lambda s: (-s.p99_share, -s.share, s.stage))
    worst = sorted(traces, key=lambda t: (-t.duration_ns, t.trace_id))[: max(0, slowest)]
    return Breakdown(
        traces,
        percentile(durations, 50),
        p99,
        p99_traces,
        stats,
        [(t, critical_path(t)) for t in worst],
    )


def hotspot_line(result: Breakdown) -> str:
    """`hotspot: <stage> (<share>% of p99)`, or `hotspot: none (no traces)`."""
    top = result.hotspot
    if top is None:
        return "hotspot: none (no traces)"
    return f"hotspot: {top.stage} ({round(top.p99_share * 100)}% of p99)"


@dataclass(frozen=True)
class StageContrast:
    """One stage's mean self time per trace among the slow traces and among the typical ones."""

    stage: str
    slow_ns: float
    typical_ns: float

    @property
    def delta_ns(self) -> float:
        return self.slow_ns - self.typical_ns


@dataclass(frozen=True)
class Comparison:
    """Slow traces against typical ones, by stage (see the module docstring), the largest difference first."""

    slow: list[Trace]
    typical: list[Trace]
    slow_from_ns: float
    typical_range_ns: tuple[float, float]
    stages: list[StageContrast]

    @property
    def slow_mean_ns(self) -> float:
        return _mean([t.duration_ns for t in self.slow])

    @property
    def typical_mean_ns(self) -> float:
        return _mean([t.duration_ns for t in self.typical])


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def compare(traces: Sequence[Trace], slow_q: float = 90.0) -> Comparison:
    """The traces at or above their `slow_q` percentile and past the p75 against the typical ones (p25..p75), by
    stage."""
    if not traces:
        return Comparison([], [], 0.0, (0.0, 0.0), [])
    durations = [t.duration_ns for t in traces]
    slow_from = percentile(durations, slow_q)
    lo, hi = percentile(durations, 25), percentile(durations, 75)
    slow = [t for t in traces if t.duration_ns >= slow_from and t.duration_ns > hi]
    typical = [t for t in traces if lo <= t.duration_ns <= hi]
    slow_selfs = [t.stage_self_ns() for t in slow]
    typical_selfs = [t.stage_self_ns() for t in typical]
    stages = sorted({stage for selfs in slow_selfs + typical_selfs for stage in selfs})

    def mean_of(stage: str, selfs: list[dict[str, int]]) -> float:
        return sum(s.get(stage, 0) for s in selfs) / len(selfs) if selfs else 0.0

    contrasts = [StageContrast(st, mean_of(st, slow_selfs), mean_of(st, typical_selfs)) for st in stages]
    contrasts.sort(key=lambda c: (-c.delta_ns, -c.slow_ns, c.stage))
    return Comparison(slow, typical, slow_from, (lo, hi), contrasts)
