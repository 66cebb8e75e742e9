"""The stack topology file: the demo shipped with the CLI, validation naming file and field, command-line overrides."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from services.cli.main import app
from services.cli.stack.layout import StackLayout
from services.cli.stack.topology import ModelGroup, StackTopology, TopologyFileError, demo_file


def test_the_demo_runs_two_v1_replicas_and_a_v2_canary_that_may_sleep() -> None:
    demo = StackTopology.demo()
    assert demo.stable == ModelGroup(subset="v1", replicas=2, pinned_versions={"fraud_mlp": [1]})
    assert (demo.stable.min_replicas, demo.stable.max_replicas, demo.stable.autoscaled) == (2, 2, False)
    canary = demo.canary
    assert canary is not None and canary.pinned_versions == {"fraud_mlp": [2]}
    assert (canary.replicas, canary.min_replicas, canary.max_replicas) == (1, 0, 1)
    assert canary.autoscaled and canary.model == "fraud_mlp" and canary.scale_down_window_s == 30
    assert canary.target_per_replica == 16
    assert demo.autoscaled == [canary]
    assert demo_file().name == "demo_topology.yaml" and demo_file().is_file()


def test_the_elastic_topology_scales_one_subset_from_zero_to_three() -> None:
    elastic = StackTopology.elastic()
    assert elastic.canary is None and elastic.autoscaled == [elastic.stable]
    g = elastic.stable
    assert (g.subset, g.replicas, g.min_replicas, g.max_replicas, g.scale_down_window_s) == ("v1", 0, 0, 3, 10)
    assert g.model == "fraud_mlp"


def test_a_group_without_bounds_is_fixed_at_its_count() -> None:
    group = ModelGroup(subset="v1", replicas=3)
    assert (group.min_replicas, group.max_replicas, group.autoscaled) == (3, 3, False)
    assert group.model is None  # no pinned model: nothing to scale on, and a fixed group needs none
    assert ModelGroup(subset="v1", pinned_versions={"a": [1], "b": [2]}, max_replicas=2, scale_on="b").model == "b"


def test_command_line_overrides() -> None:
    demo = StackTopology.demo()
    assert demo.with_counts() == demo
    assert demo.with_counts(3).stable.replicas == 3
    assert demo.with_counts(canary=False).canary is None
    assert demo.with_counts(canary=True) == demo
    with pytest.raises(TopologyFileError, match="no canary"):
        demo.with_counts(canary=False).with_counts(canary=True)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("stable: {subset: v1, replicas: 0}\n", "stable: Value error, max_replicas is 0"),
        ("stable: {subset: v1, pinned_versions: {fraud_mlp: [one]}}\n", "stable.pinned_versions.fraud_mlp.0"),
        ("stable: {subset: v1, replica: 2}\n", "stable.replica: unknown field"),
        ("stable: {subset: V 1}\n", "stable.subset: String should match pattern"),
        ("canary: {subset: v2}\n", "stable: Field required"),
        ("stable: {subset: v1}\ncanary: {subset: v1}\n", "the canary's subset must differ"),
        ("stable: [\n", "while parsing"),
    ],
)
def test_a_bad_file_names_the_file_and_the_field(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "stack.yaml"
    path.write_text(text)
    with pytest.raises(TopologyFileError) as info:
        StackTopology.load(path)
    assert str(info.value).startswith(f"{path}: ") and fragment in str(info.value)


PINNED = "pinned_versions: {fraud_mlp: [2]}"


def canary(fields: str) -> str:
    """A canary group of these fields, pinned to fraud_mlp v2."""
    return "{subset: v2, " + fields + ", " + PINNED + "}"


@pytest.mark.parametrize(
    ("group", "fragment"),
    [
        (canary("min_replicas: 3, max_replicas: 1, replicas: 1"), "min_replicas 3 is above"),
        (canary("min_replicas: 1, max_replicas: 3, replicas: 4"), "outside [min_replicas, max_replicas] = [1, 3]"),
        (canary("min_replicas: 1, max_replicas: 3, replicas: 0"), "replicas 0 is outside"),
        (canary("min_replicas: 0, max_replicas: 0, replicas: 0"), "max_replicas is 0"),
        (canary("max_replicas: 9"), "canary.max_replicas: Input should be less than or equal to 8"),
        (
            canary("min_replicas: 0, max_replicas: 1, scale_down_window_s: 1.5"),
            "scale_down_window_s 1.5 is shorter than a replica's cold start (2 s)",
        ),
        ("{subset: v2, max_replicas: 2}", "scale_on is required: the group scales and pins 0 models"),
        (
            "{subset: v2, max_replicas: 2, pinned_versions: {a: [1], b: [1]}}",
            "scale_on is required: the group scales and pins 2 models (a, b)",
        ),
        (canary("max_replicas: 2, target_per_replica: 0"), "canary.target_per_replica: Input"),
    ],
)
def test_a_bad_scaling_policy_names_the_field(tmp_path: Path, group: str, fragment: str) -> None:
    path = tmp_path / "stack.yaml"
    path.write_text(f"stable: {{subset: v1}}\ncanary: {group}\n")
    with pytest.raises(TopologyFileError) as info:
        StackTopology.load(path)
    assert str(info.value).startswith(f"{path}: canary") and fragment in str(info.value), str(info.value)


def test_scaling_needs_the_mesh_that_starts_replicas_on_demand(tmp_path: Path) -> None:
    path = tmp_path / "stack.yaml"
    path.write_text(f"stable: {{subset: v1, min_replicas: 0, max_replicas: 2, {PINNED}}}\n")
    assert StackTopology.load(path).stable.autoscaled
    with pytest.raises(TopologyFileError, match=r"stable: .*min_replicas: scale to zero needs the mesh"):
        StackTopology.load(path, on_demand=False)
    demo = StackTopology.demo()
    with pytest.raises(TopologyFileError, match=r"canary: .*scale to zero needs the mesh"):
        demo.with_counts(on_demand=False)
    assert demo.with_counts(canary=False, on_demand=False).canary is None  # the fixed stable group needs no mesh
    path.write_text(f"stable: {{subset: v1, min_replicas: 1, max_replicas: 2, {PINNED}}}\n")
    with pytest.raises(TopologyFileError, match="max_replicas: autoscaling needs the mesh"):
        StackTopology.load(path, on_demand=False)


def test_up_without_the_mesh_refuses_the_demo_canary_and_says_how_to_run(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["up", "--no-mesh", "--log-dir", str(tmp_path / "logs")])
    assert result.exit_code == 2
    assert "demo_topology.yaml" in result.output and "scale to zero needs the mesh" in result.output
    assert "--no-canary" in result.output and not (tmp_path / "logs").exists()


def test_the_replica_override_keeps_a_fixed_group_fixed_and_an_autoscaled_one_bounded(tmp_path: Path) -> None:
    demo = StackTopology.demo()
    assert (demo.with_counts(3).stable.min_replicas, demo.with_counts(3).stable.max_replicas) == (3, 3)
    elastic = StackTopology.elastic()
    assert elastic.with_counts(2).stable.replicas == 2 and elastic.with_counts(2).stable.max_replicas == 3
    with pytest.raises(TopologyFileError, match=r"stable: .*replicas 4 is outside"):
        elastic.with_counts(4)


def test_a_missing_file_is_a_topology_error(tmp_path: Path) -> None:
    with pytest.raises(TopologyFileError, match="No such file"):
        StackTopology.load(tmp_path / "nope.yaml")


def test_up_refuses_a_bad_topology_before_starting_anything(tmp_path: Path) -> None:
    bad = tmp_path / "stack.yaml"
    bad.write_text("stable: {subset: v1, replicas: many}\n")
    runner = CliRunner()
    result = runner.invoke(app, ["up", "--topology", str(bad), "--log-dir", str(tmp_path / "logs")])
    assert result.exit_code == 2
    assert "topology" in result.output and "stable.replicas" in result.output
    no_canary = tmp_path / "stable-only.yaml"
    no_canary.write_text("stable: {subset: v1}\n")
    result = runner.invoke(app, ["up", "--topology", str(no_canary), "--canary", "--log-dir", str(tmp_path / "l")])
    assert result.exit_code == 2 and "no canary" in result.output
    assert not (tmp_path / "logs").exists() and not (tmp_path / "l").exists()


def test_up_refuses_a_missing_model_repository(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["up", "--models", str(tmp_path / "none"), "--log-dir", str(tmp_path / "logs")])
    assert result.exit_code == 2 and "model repository" in result.output


def test_up_refuses_a_log_dir_too_deep_for_its_sockets(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * max(1, 90 - len(str(tmp_path))))  # its admin.sock fits, sockets/mesh-feature.sock not
    result = CliRunner().invoke(app, ["up", "--log-dir", str(deep)])
    assert result.exit_code == 2 and "layout" in result.output and "choose a shorter --log-dir" in result.output
    assert not deep.exists()


def test_a_crowded_topology_clashes_only_where_the_services_take_ports(tmp_path: Path) -> None:
    path = tmp_path / "crowded.yaml"
    path.write_text("stable: {subset: v1, replicas: 8}\ncanary: {subset: v2, replicas: 3}\n")
    crowded = StackTopology.load(path)
    logs = tmp_path / "logs"
    on_sockets = StackLayout.local(8000, topology=crowded, models_dir=tmp_path, mesh=True, log_dir=logs)
    assert on_sockets.socket_dir == logs.resolve() / "sockets" and not on_sockets.listen_ports
    with pytest.raises(ValueError, match=r"port 8101: .*model-v2-c"):  # its gRPC port is the model listener's
        StackLayout.local(8000, topology=crowded, models_dir=tmp_path, mesh=True, log_dir=logs, sockets=False)


def test_the_gateway_runs_its_replica_count() -> None:
    demo = StackTopology.demo()
    assert demo.gateway.replicas == 1
    assert demo.with_counts(gateway_replicas=2).gateway.replicas == 2
    assert demo.with_counts(gateway_replicas=2).with_counts(3).gateway.replicas == 2  # other overrides keep it


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (
            "stable: {subset: v1}\ngateway: {replicas: 0}\n",
            "gateway.replicas: Input should be greater than or equal to 1",
        ),
        ("stable: {subset: v1}\ngateway: {replicas: 9}\n", "gateway.replicas: Input should be less than or equal to 8"),
        ("stable: {subset: v1}\ngateway: {replica: 2}\n", "gateway.replica: unknown field"),
    ],
)
def test_a_bad_gateway_group_names_the_field(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "stack.yaml"
    path.write_text(text)
    with pytest.raises(TopologyFileError, match="gateway") as info:
        StackTopology.load(path)
    assert fragment in str(info.value)
