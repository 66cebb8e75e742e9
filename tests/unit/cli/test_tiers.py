"""`meshserve up --topology edge_cloud` before anything starts: the two-tier topology file, both tiers' ports and
state dirs, what each tier's processes get (the edge gateway's tier settings and cloud token, the replicas' models),
the meshes rendered for each tier, and the tier-mix demo's helpers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from rich.console import Console

from services.cli.stack.credentials import StackSecrets
from services.cli.stack.tiers.layout import (
    EDGE_CLOUD,
    EdgeCloudTopology,
    TierLayouts,
    tier_layouts,
    tier_topology_file,
    wan_delay_ms,
)
from services.cli.stack.tiers.up import TierRun, prepare_tier
from services.cli.stack.topology import TopologyFileError
from services.cli.tier_demo import general_row, metric_sum, sensitive_inputs
from services.common import tokens


def layouts(tmp_path: Path, port_base: int = 8000) -> TierLayouts:
    return tier_layouts(EdgeCloudTopology.shipped(), tmp_path / "state", port_base, models_dir=tmp_path)


def test_the_shipped_topology_runs_the_full_model_in_the_cloud_and_the_int8_one_at_the_edge() -> None:
    t = EdgeCloudTopology.shipped()
    assert t.cloud.stable.pinned_versions == {"fraud_mlp": [1]} and t.cloud.serve_models == ["fraud_mlp"]
    assert t.edge.stable.pinned_versions == {"fraud_mlp": [2]} and t.edge.serve_models == ["fraud_mlp"]
    assert wan_delay_ms() == 30.0  # istio/edge's route out


def test_topology_names_and_files(tmp_path: Path) -> None:
    assert tier_topology_file(None) is None
    assert tier_topology_file(Path(EDGE_CLOUD)) is not None
    single = tmp_path / "single.yaml"
    single.write_text("stable: {subset: v1}\n")
    assert tier_topology_file(single) is None
    two = tmp_path / "two.yaml"
    two.write_text("cloud: {stable: {subset: v1}}\nedge: {stable: {subset: v2}}\n")
    assert tier_topology_file(two) == two
    assert EdgeCloudTopology.load(two).edge.stable.subset == "v2"


def test_a_tier_that_would_scale_is_refused_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(
        "cloud: {stable: {subset: v1, replicas: 1, max_replicas: 2, pinned_versions: {m: [1]}}}\n"
        "edge: {stable: {subset: v2}}\n"
    )
    with pytest.raises(TopologyFileError, match=r"two.yaml: cloud: .*a tier's model group is fixed"):
        EdgeCloudTopology.load(path)


def test_tiers_have_their_own_ports_state_dirs_and_istio(tmp_path: Path) -> None:
    t = layouts(tmp_path)
    assert t.edge.ingress_port == 8080 and t.cloud.ingress_port == 8280 and t.egress == "127.0.0.1:8104"
    edge_ports = {p for _, p in t.edge.ports()} | {t.egress_port}
    cloud_ports = {p for _, p in t.cloud.ports()}
    assert not edge_ports & cloud_ports
    assert t.edge.log_dir == (tmp_path / "state" / "edge").resolve()
    assert t.cloud.log_dir == (tmp_path / "state" / "cloud").resolve()
    assert t.edge.admin_socket != t.cloud.admin_socket
    assert [p.name for p in t.edge.istio_paths] == ["istio", "edge"]
    assert [p.name for p in t.cloud.istio_paths] == ["istio", "cloud"]
    free = layouts(tmp_path, 0)
    assert not ({p for _, p in free.edge.ports()} | {free.egress_port}) & {p for _, p in free.cloud.ports()}


def prepared(tmp_path: Path) -> tuple[TierLayouts, dict[str, TierRun]]:
    t = layouts(tmp_path, 0)
    runs: dict[str, TierRun] = {}
    stop = asyncio.Event()
    for tier in ("cloud", "edge"):
        runs[tier] = prepare_tier(t, tier, Console(quiet=True), stop, runs)
    return t, runs


def test_the_edge_gateway_reaches_the_cloud_through_its_egress_with_a_cloud_token(tmp_path: Path) -> None:
    t, runs = prepared(tmp_path)
    edge = {s.name: s for s in runs["edge"].specs}
    gw = edge["gateway"].env
    assert gw["MESHSERVE_GATEWAY_TIER"] == "edge"
    assert gw["MESHSERVE_GATEWAY_CLOUD_URL"] == t.egress
    assert "MESHSERVE_GATEWAY_CLOUD_TLS_CA_FILE" not in gw  # the egress listener speaks TLS to the cloud itself
    token_file = Path(gw["MESHSERVE_GATEWAY_CLOUD_TOKEN_FILE"])
    assert token_file.parent == StackSecrets.of(t.tier_dir("edge")).dir and token_file.stat().st_mode & 0o077 == 0
    cloud_secrets = StackSecrets.of(t.tier_dir("cloud"))
    claims = tokens.verify(token_file.read_text(), cloud_secrets.jwks())
    assert claims.subject == "edge-gateway" and claims.expires_at is not None
    with pytest.raises(tokens.TokenError):  # the edge's own key did not sign it
        tokens.verify(token_file.read_text(), StackSecrets.of(t.tier_dir("edge")).jwks())
    assert json.loads(edge["model-v2-a"].env["MESHSERVE_MODEL_SERVE_MODELS"]) == ["fraud_mlp"]
    assert json.loads(edge["model-v2-a"].env["MESHSERVE_MODEL_PINNED_VERSIONS"]) == {"fraud_mlp": [2]}
    egress = json.loads((t.tier_dir("edge") / "mesh" / "state.json").read_text())["topology"]["egress"]
    assert egress["listen"] == t.egress and egress["cloud_ingress"] == t.cloud.address(t.cloud.ingress_port)
    assert egress["tls_ca"] == str(cloud_secrets.ca_cert)


def test_the_cloud_gateway_is_the_cloud_tier_and_its_ingress_denies_the_sensitive_class(tmp_path: Path) -> None:
    t, runs = prepared(tmp_path)
    cloud = {s.name: s for s in runs["cloud"].specs}
    gw = cloud["gateway"].env
    assert gw["MESHSERVE_GATEWAY_TIER"] == "cloud" and "MESHSERVE_GATEWAY_CLOUD_URL" not in gw
    assert json.loads(gw["MESHSERVE_GATEWAY_PUBLIC_MODELS"]) == ["fraud_mlp"]
    assert json.loads(cloud["model-v1-a"].env["MESHSERVE_MODEL_PINNED_VERSIONS"]) == {"fraud_mlp": [1]}
    assert "x-meshserve-data-class" in (t.tier_dir("cloud") / "mesh" / "envoy.yaml").read_text()
    assert runs["cloud"].secrets.dir != runs["edge"].secrets.dir


def test_the_tier_demo_blanks_exactly_the_sensitive_fields() -> None:
    sensitive = sensitive_inputs()
    assert sensitive == ["user_id", "merchant_id", "device_id"]
    row = {"user_id": "u1", "merchant_id": "m1", "device_id": "d1", "amount": 3.0, "country": "us"}
    assert general_row(row, sensitive) == {"user_id": "", "merchant_id": "", "device_id": "", "amount": 3.0,
                                           "country": "us"}  # fmt: skip
    text = 'x_total{a="1"} 2\nx_total{a="2"} 3.5\nx_total_other 9\n# HELP x_total y\n'
    assert metric_sum(text, "x_total") == 5.5


def test_up_refuses_one_tier_flags_with_two_tiers(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from services.cli.main import app

    args = ["up", "--topology", EDGE_CLOUD, "--log-dir", str(tmp_path), "--replicas", "2", "--no-mesh"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "--replicas, --no-mesh: not with two tiers" in " ".join(result.output.split())
    assert not (tmp_path / "cloud").exists()  # refused before anything was made


def test_token_and_ca_of_two_tiers_are_the_edges(tmp_path: Path) -> None:
    from services.cli.stack.state import entry_dir
    from services.cli.tokens import issue

    edge = StackSecrets.ensure(tmp_path / "edge")
    (tmp_path / "stack.json").write_text(
        json.dumps({"tiers": {"cloud": str(tmp_path / "cloud"), "edge": str(edge.dir.parent)}})
    )
    assert entry_dir(tmp_path) == edge.dir.parent
    assert tokens.verify(issue(tmp_path, "shop"), edge.jwks()).subject == "shop"
    assert entry_dir(tmp_path / "edge") == tmp_path / "edge"  # one stack: its own folder
