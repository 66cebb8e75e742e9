"""bench.elastic's topologies: the shipped elastic one's group as the benchmark reads it, and the fixed-size stack it
writes from it, which `meshserve up` accepts as a group that does not scale."""

from __future__ import annotations

from pathlib import Path

from bench.elastic import ELASTIC_TOPOLOGY, fixed_topology, read_group
from services.cli.stack.topology import StackTopology


def test_the_elastic_group_scales_one_subset_from_zero() -> None:
    group = read_group(ELASTIC_TOPOLOGY)
    assert group.replicas == 0 and group.most >= 2
    stable = StackTopology.load(ELASTIC_TOPOLOGY).stable
    assert (group.subset, group.model, group.most) == (stable.subset, stable.model, stable.max_replicas)
    assert stable.autoscaled and stable.min_replicas == 0


def test_the_fixed_stack_is_the_same_group_at_its_most_replicas(tmp_path: Path) -> None:
    most = read_group(ELASTIC_TOPOLOGY).most
    path = fixed_topology(ELASTIC_TOPOLOGY, tmp_path / "fixed.yaml", most)
    fixed = StackTopology.load(path, on_demand=False)  # a fixed group needs no replicas started while it runs
    elastic = StackTopology.load(ELASTIC_TOPOLOGY)
    assert not fixed.stable.autoscaled
    assert (fixed.stable.replicas, fixed.stable.min_replicas, fixed.stable.max_replicas) == (most, most, most)
    assert fixed.stable.pinned_versions == elastic.stable.pinned_versions
    assert fixed.stable.subset == elastic.stable.subset and fixed.canary == elastic.canary
    assert read_group(path).replicas == most
