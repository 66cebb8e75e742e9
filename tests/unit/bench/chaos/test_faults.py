"""bench.chaos.faults: finding the process to hit in stack.json (or Valkey under the supervisor), and hot-loading a
version by copying it beside the model's others."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.chaos import faults


def write_state(log_dir: Path, names: dict[str, int]) -> None:
    services = [{"name": n, "address": None, "health_url": None, "pid": p} for n, p in names.items()]
    (log_dir / "stack.json").write_text(json.dumps({"services": services}))


def test_pid_of_picks_the_nth_process_of_a_group_by_name(tmp_path: Path) -> None:
    write_state(tmp_path, {"model-v1-b": 12, "model-v1-a": 11, "model-v2": 13, "gateway": 20, "feature": 30})
    assert faults.pid_of(tmp_path, "model-v1") == ("model-v1-a", 11)
    assert faults.pid_of(tmp_path, "model-v1", 1) == ("model-v1-b", 12)
    assert faults.pid_of(tmp_path, "gateway") == ("gateway", 20)
    with pytest.raises(faults.FaultError, match="no process #2 named gateway"):
        faults.pid_of(tmp_path, "gateway", 1)


def test_gateway_replicas_are_found_by_their_prefix() -> None:
    assert faults.pick(["gateway-b", "gateway-a", "model-v1-a"], "gateway") == "gateway-a"
    with pytest.raises(faults.FaultError):  # a longer word is not a replica
        faults.pick(["gatewayish"], "gateway")


def fake_proc(root: Path, entries: dict[int, tuple[str, str, int]]) -> Path:
    """A /proc with pid -> (comm, state, ppid)."""
    for pid, (comm, state, ppid) in entries.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "stat").write_text(f"{pid} ({comm}) {state} {ppid} 1 1 0 -1\n")
    (root / "self").mkdir()
    return root


def test_children_reads_proc_and_skips_zombies(tmp_path: Path) -> None:
    proc = fake_proc(
        tmp_path / "proc",
        {
            100: ("python", "S", 1),
            101: ("valkey-server", "S", 100),
            102: ("valkey-server", "Z", 100),
            103: ("x) y", "R", 100),
        },
    )
    assert faults.children(100, proc) == {101: "valkey-server", 103: "x) y"}


def test_valkey_is_taken_from_stack_json_when_supervised(tmp_path: Path) -> None:
    write_state(tmp_path, {"valkey": 55, "gateway": 20})
    assert faults.valkey_pid(tmp_path, supervisor_pid=1) == 55


def test_hot_load_copies_a_version_as_the_next_number(tmp_path: Path) -> None:
    model = tmp_path / "fraud_mlp"
    for v in ("1", "2"):
        (model / v).mkdir(parents=True)
        (model / v / "model.pt").write_bytes(f"weights {v}".encode())
    (model / "config.yaml").write_text("name: fraud_mlp\n")
    assert faults.hot_load(tmp_path, "fraud_mlp", 2) == 3
    assert (model / "3" / "model.pt").read_bytes() == b"weights 2"
    assert faults.hot_load(tmp_path, "fraud_mlp", 2) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fraud_mlp"]  # no staging folder left behind
    with pytest.raises(faults.FaultError):
        faults.hot_load(tmp_path, "fraud_mlp", 9)


def test_a_canary_split_already_in_force_is_left_alone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import services.cli.canary as canary

    calls: list[dict[str, object]] = []
    split = {"v1": 90, "v2": 10}

    def change(log_dir: Path, service: str = "model", **kwargs: object) -> dict[str, int]:
        calls.append(kwargs)
        if kwargs.get("weights"):
            split.update(kwargs["weights"])  # type: ignore[arg-type]
        return dict(split)

    monkeypatch.setattr(canary, "change", change)
    assert faults.set_canary(tmp_path, 10) == ({"v1": 90, "v2": 10}, False)
    assert faults.set_canary(tmp_path, 50) == ({"v1": 50, "v2": 50}, True)
    assert faults.set_canary(tmp_path, None) == ({"v1": 100, "v2": 0}, True)
    assert [c.get("weights") for c in calls] == [None, None, {"v1": 50, "v2": 50}, None, {"v1": 100, "v2": 0}]

    def times_out(log_dir: Path, service: str = "model", **kwargs: object) -> dict[str, int]:
        raise TimeoutError("envoy did not load route 'outbound_model'")

    monkeypatch.setattr(canary, "change", times_out)
    with pytest.raises(faults.FaultError, match="canary: envoy did not load"):
        faults.set_canary(tmp_path, 50)
