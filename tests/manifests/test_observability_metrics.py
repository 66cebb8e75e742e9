"""Metric names in PromQL (alerts, dashboard) against the metrics the services define.

Helpers used by the other test_observability_* modules, and their own tests. A metric is defined
when services/ constructs it: prometheus_client's Counter/Gauge/Histogram/Summary/Info/Enum or a
*MetricFamily (custom collectors, e.g. services/model/gpu_metrics.py) with a literal name. The
exposed series names follow prometheus_client: a counter `x` (or `x_total`) is `x_total` (and
`x_created`); a histogram `x` is `x_bucket`, `x_sum`, `x_count`; a summary `x`, `x_sum`, `x_count`.
Istio's and Envoy's metrics (istio_*, envoy_*) come from the sidecars and are exempt.
"""

from __future__ import annotations

import ast
import functools
import re

from tests.manifests.support import REPO

SERVICES = REPO / "services"
EXEMPT_PREFIXES = ("istio_", "envoy_")

_CONSTRUCTORS = {
    "Counter": "counter",
    "CounterMetricFamily": "counter",
    "Gauge": "gauge",
    "GaugeMetricFamily": "gauge",
    "Histogram": "histogram",
    "HistogramMetricFamily": "histogram",
    "Summary": "summary",
    "SummaryMetricFamily": "summary",
    "Info": "info",
    "InfoMetricFamily": "info",
    "Enum": "gauge",
}

# PromQL words that are not metric names when not followed by "(".
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool"}
    | {"inf", "nan"}
)
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def exposed_names(name: str, kind: str) -> set[str]:
    """The series names prometheus_client exposes for one metric."""
    if kind == "counter":
        base = name.removesuffix("_total")
        return {f"{base}_total", f"{base}_created"}
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_created"}
    if kind == "summary":
        return {name, f"{name}_sum", f"{name}_count", f"{name}_created"}
    if kind == "info":
        return {f"{name.removesuffix('_info')}_info"}
    return {name}


@functools.cache
def defined_metrics() -> dict[str, str]:
    """Exposed series name -> the services/ file (relative) that defines the metric."""
    found: dict[str, str] = {}
    for path in sorted(SERVICES.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            fname = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            kind = _CONSTRUCTORS.get(fname)
            first = node.args[0]
            if kind is None or not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                continue
            if not _IDENT.fullmatch(first.value):
                continue
            for series in exposed_names(first.value, kind):
                found.setdefault(series, str(path.relative_to(REPO)))
    return found


def _strip_parens_after(text: str, words: tuple[str, ...]) -> str:
    """Remove `word (...)` label lists (by, without, on, ignoring, group_left, group_right)."""
    pattern = re.compile(r"\b(?:" + "|".join(words) + r")\s*\(([^()]*)\)")
    return pattern.sub(" ", text)


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (functions, keywords, labels, strings and durations removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals (label values, le="0.5")
    text = re.sub(r"'(?:[^'\\]|\\.)*'", "''", text)
    text = re.sub(r"\{[^{}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\[\]]*\]", " ", text)  # range/subquery durations
    text = re.sub(r"\$\{[^}]*\}|\$\w+", " ", text)  # Grafana variables
    text = _strip_parens_after(text, ("by", "without", "on", "ignoring", "group_left", "group_right"))
    text = re.sub(r"\boffset\s+-?[0-9a-z]+", " ", text)
    names = set()
    for match in _IDENT.finditer(text):
        word = match.group(0)
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or word.lower() in _KEYWORDS:
            continue
        if match.start() > 0 and (text[match.start() - 1].isdigit() or text[match.start() - 1] == "."):
            continue  # the exponent or unit of a number (1e3, 0.5)
        names.add(word)
    return names


def unknown_metrics(exprs: dict[str, str]) -> list[str]:
    """'where: name' for every metric name used in `exprs` (where -> PromQL) that services/ does not define."""
    defined = defined_metrics()
    return [
        f"{where}: {name}"
        for where, expr in exprs.items()
        for name in sorted(metric_names(expr))
        if name not in defined and not name.startswith(EXEMPT_PREFIXES)
    ]


# -- tests of the helpers ----------------------------------------------------------------------------


def test_defined_metrics_cover_every_service() -> None:
    defined = defined_metrics()
    for series in (
        "meshserve_grpc_server_handled_total",
        "meshserve_grpc_server_handling_seconds_bucket",
        "meshserve_gateway_requests_total",
        "meshserve_gateway_stage_duration_seconds_count",
        "meshserve_model_pending_requests",
        "meshserve_model_batch_size_bucket",
        "meshserve_gpu_utilization_ratio",
        "meshserve_cache_hits_total",
        "meshserve_feature_rows_total",
    ):
        assert series in defined, series
    # A histogram's base name is not a series of its own; a counter is exposed with _total.
    assert "meshserve_model_batch_size" not in defined
    assert defined["meshserve_gpu_utilization_ratio"] == "services/model/gpu_metrics.py"


def test_metric_names_parses_promql() -> None:
    expr = """
      histogram_quantile(0.99, sum by (pipeline, le) (rate(foo_seconds_bucket{le="0.5", code=~"A|B"}[5m])))
      > on (namespace, model) group_left () 1.5 * min by (namespace) (bar_total offset 1h) + 1e-3
      and ignoring (pod) baz{a="b"} unless count_values("x", qux) or label_replace(up, "a", "$1", "b", "(.*)")
      / sum without (instance) (rate(istio_requests_total[$__rate_interval]))
    """
    assert metric_names(expr) == {"foo_seconds_bucket", "bar_total", "baz", "qux", "up", "istio_requests_total"}


def test_unknown_metrics_are_reported() -> None:
    exprs = {"a": "rate(meshserve_gateway_requests_total[5m])", "b": "meshserve_model_batch_size > 1"}
    exprs["c"] = "sum(rate(istio_requests_total[5m])) / sum(rate(meshserve_no_such_total[5m]))"
    assert unknown_metrics(exprs) == ["b: meshserve_model_batch_size", "c: meshserve_no_such_total"]
