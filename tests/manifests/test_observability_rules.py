"""The alerts in k8s/observability/prometheusrule.yaml: structure, metric names, and promtool.

The PrometheusRule's spec.groups is the only copy of the rules. promtool reads plain rule files, so
the promtool tests write spec.groups to rules.yaml in a temporary directory next to copies of
k8s/observability/tests/*.yaml (whose `rule_files: [rules.yaml]` names it) and run
`promtool check rules` and `promtool test rules` there. promtool comes from Debian's `prometheus`
package (tools/ensure_system_packages.sh installs it where it can); without it those tests skip.
By hand:
  python -c "import yaml; d = yaml.safe_load(open('k8s/observability/prometheusrule.yaml')); \
    yaml.safe_dump({'groups': d['spec']['groups']}, open('k8s/observability/tests/rules.yaml', 'w'))"
  (cd k8s/observability/tests && promtool test rules *.yaml; rm rules.yaml)
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.manifests.support import REPO, Doc, load_file
from tests.manifests.test_observability_metrics import unknown_metrics

OBSERVABILITY = REPO / "k8s" / "observability"
RULE_FILE = OBSERVABILITY / "prometheusrule.yaml"
TESTS = OBSERVABILITY / "tests"
SEVERITIES = {"critical", "warning", "info"}


def rule_groups() -> list[Doc]:
    (rule,) = load_file(RULE_FILE)
    assert rule["kind"] == "PrometheusRule"
    return rule["spec"]["groups"]


def alerts() -> list[Doc]:
    return [r for g in rule_groups() for r in g["rules"] if "alert" in r]


def unit_test_files() -> list[Path]:
    return sorted(p for p in TESTS.glob("*.yaml") if p.name != "rules.yaml")


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip(
            "promtool not found: install Debian's `prometheus` package (make test runs "
            "tools/ensure_system_packages.sh, which does so as root with apt)"
        )
    return found


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory with rules.yaml (spec.groups) and copies of the unit test files."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups()}, sort_keys=False))
    for path in unit_test_files():
        shutil.copy(path, tmp_path / path.name)
    return tmp_path


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_promtool_check_rules(promtool: str, workdir: Path) -> None:
    proc = run([promtool, "check", "rules", "rules.yaml"], workdir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in rule_groups())} rules found" in proc.stdout + proc.stderr


def test_promtool_unit_tests(promtool: str, workdir: Path) -> None:
    names = [p.name for p in unit_test_files()]
    assert names, f"no promtool tests in {TESTS}"
    proc = run([promtool, "test", "rules", *names], workdir)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_alerts_are_complete() -> None:
    """Every alert: a `for`, a severity, a summary, a description and a runbook hint."""
    names = [a["alert"] for a in alerts()]
    assert len(names) == len(set(names)), names
    for alert in alerts():
        name = alert["alert"]
        assert name.startswith("Meshserve"), name
        assert alert.get("for"), f"{name}: no `for:` (would fire on one bad evaluation)"
        assert alert.get("labels", {}).get("severity") in SEVERITIES, name
        annotations = alert.get("annotations", {})
        for key in ("summary", "description", "runbook"):
            assert annotations.get(key, "").strip(), f"{name}: no {key} annotation"


def test_required_alerts_exist() -> None:
    """The issue's list: errors, p99 over SLO, queue growing, GPU saturated, cache collapse, canary."""
    exprs = {a["alert"]: a["expr"] for a in alerts()}
    wanted = {
        "meshserve_grpc_server_handled_total": "MeshserveServiceErrorRatioHigh",
        "meshserve_gateway_requests_total": "MeshservePipelineErrorRatioHigh",
        "meshserve_gateway_request_duration_seconds_bucket": "MeshservePipelineP99OverSLO",
        "meshserve_grpc_server_handling_seconds_bucket": "MeshserveRpcP99OverSLO",
        "meshserve_model_pending_requests": "MeshserveModelQueueGrowing",
        "meshserve_gpu_utilization_ratio": "MeshserveGpuSaturated",
        'cache="hit"': "MeshserveCacheHitRatioCollapsed",
        "meshserve_model_requests_total": "MeshserveCanaryErrorRatioWorse",
        "meshserve_model_request_duration_seconds_bucket": "MeshserveCanaryP99Worse",
    }
    for needle, name in wanted.items():
        assert name in exprs, name
        assert needle in exprs[name], (name, needle)
    assert "histogram_quantile(0.99" in exprs["MeshservePipelineP99OverSLO"]
    assert "deriv(" in exprs["MeshserveModelQueueGrowing"]


def test_rule_metrics_are_defined_in_services() -> None:
    exprs = {f"{g['name']}/{r.get('alert') or r.get('record')}": r["expr"] for g in rule_groups() for r in g["rules"]}
    unknown = unknown_metrics(exprs)
    assert not unknown, "metrics not defined in services/:\n" + "\n".join(unknown)


def _cases(doc: Doc) -> list[tuple[str, bool]]:
    """(alertname, fires) for every alert_rule_test entry of every test group."""
    out: list[tuple[str, bool]] = []
    for test in doc.get("tests", []):
        for case in test.get("alert_rule_test", []):
            out.append((case["alertname"], bool(case.get("exp_alerts"))))
    return out


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    cases: list[tuple[str, bool]] = []
    for path in unit_test_files():
        doc: dict[str, Any] = yaml.safe_load(path.read_text())
        assert doc.get("rule_files") == ["rules.yaml"], f"{path.name}: rule_files must be [rules.yaml]"
        cases += _cases(doc)
    known = {a["alert"] for a in alerts()}
    assert {name for name, _ in cases} <= known, "tests name alerts that do not exist"
    for name in sorted(known):
        assert (name, True) in cases, f"{name}: no promtool case where it fires"
        assert (name, False) in cases, f"{name}: no promtool case where it stays quiet"
