"""The stack topology file: the demo shipped with the CLI, validation naming file and field, command-line overrides."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from services.cli.main import app
from services.cli.stack.topology import ModelGroup, StackTopology, TopologyFileError, demo_file


def test_the_demo_runs_two_v1_replicas_and_a_v2_canary() -> None:
    demo = StackTopology.demo()
    assert demo.stable == ModelGroup(subset="v1", replicas=2, pinned_versions={"fraud_mlp": [1]})
    assert demo.canary == ModelGroup(subset="v2", replicas=1, pinned_versions={"fraud_mlp": [2]})
    assert demo_file().name == "demo_topology.yaml" and demo_file().is_file()


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
        ("stable: {subset: v1, replicas: 0}\n", "stable.replicas: Input should be greater than or equal to 1"),
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


def test_up_refuses_a_topology_whose_ports_clash(tmp_path: Path) -> None:
    crowded = tmp_path / "crowded.yaml"
    crowded.write_text("stable: {subset: v1, replicas: 8}\ncanary: {subset: v2, replicas: 3}\n")
    result = CliRunner().invoke(app, ["up", "--topology", str(crowded), "--log-dir", str(tmp_path / "logs")])
    assert result.exit_code == 2 and "layout" in result.output and "port 8101" in result.output
    assert not (tmp_path / "logs").exists()


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
