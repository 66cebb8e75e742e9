"""The local stack's layout: default ports, free ports, process specs and their dependencies, the supervised Valkey,
gateway replicas, Envoy's admin socket, the secrets each process and the mesh get."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from services.cli.stack import ports as port_module
from services.cli.stack.credentials import StackSecrets
from services.cli.stack.layout import StackLayout
from services.cli.stack.mesh import mesh_topology
from services.cli.stack.specs import build_specs, busy_ports
from services.cli.stack.topology import StackTopology
from services.common.tokens import LOCAL_ISSUER


def test_default_ports_follow_the_documented_layout(tmp_path: Path) -> None:
    t = StackLayout.local(8000, models_dir=tmp_path)
    specs = {s.name: s for s in build_specs(t, "redis://127.0.0.1:6379")}
    assert specs["gateway"].port == 8000 and specs["gateway"].metrics_port == 9000
    assert specs["model-v1-a"].port == 8001 and specs["model-v1-a"].metrics_port == 9001
    assert specs["feature"].port == 8002 and specs["cache"].port == 8003
    assert specs["model-v1-b"].port == 8011 and specs["model-v2"].port == 8021
    assert list(specs)[-1] == "gateway"
    assert set(specs["gateway"].depends_on) == set(specs) - {"gateway"}


def test_specs_carry_settings(tmp_path: Path) -> None:
    t = StackLayout.local(8000, models_dir=tmp_path, pipelines_dir=tmp_path / "p")
    specs = {s.name: s for s in build_specs(t, "redis://x:1")}
    assert json.loads(specs["model-v1-b"].env["MESHSERVE_MODEL_PINNED_VERSIONS"]) == {"fraud_mlp": [1]}
    assert json.loads(specs["model-v2"].env["MESHSERVE_MODEL_PINNED_VERSIONS"]) == {"fraud_mlp": [2]}
    assert specs["model-v2"].env["MESHSERVE_MODEL_REPOSITORY"] == str(tmp_path.resolve())
    assert specs["feature"].env["MESHSERVE_REDIS_URL"] == specs["cache"].env["MESHSERVE_REDIS_URL"] == "redis://x:1"
    gw = specs["gateway"].env
    assert gw["MESHSERVE_GATEWAY_PORT"] == "8000"
    assert gw["MESHSERVE_GATEWAY_MODEL_ADDRESS"] == "127.0.0.1:8001"
    assert gw["MESHSERVE_GATEWAY_FEATURE_ADDRESS"] == "127.0.0.1:8002"
    assert gw["MESHSERVE_GATEWAY_CACHE_ADDRESS"] == "127.0.0.1:8003"
    assert gw["MESHSERVE_GATEWAY_PIPELINES_DIR"] == str((tmp_path / "p").resolve())
    assert specs["gateway"].argv[1:] == ["-m", "services.gateway"]


def test_port_base_zero_picks_distinct_free_ports(tmp_path: Path) -> None:
    three_no_canary = StackTopology.demo().with_counts(3, canary=False)
    t = StackLayout.local(0, gateway_port=12345, models_dir=tmp_path, topology=three_no_canary)
    specs = build_specs(t, "redis://x:1")
    assert [s.name for s in specs] == ["model-v1-a", "model-v1-b", "model-v1-c", "feature", "cache", "gateway"]
    ports = [p for s in specs for p in (s.port, s.metrics_port)]
    assert len(set(ports)) == len(ports) and 12345 in ports


def test_mesh_puts_envoy_between_the_gateway_and_its_upstreams(tmp_path: Path) -> None:
    t = StackLayout.local(8000, models_dir=tmp_path, mesh=True)
    assert (t.ingress_port, t.admin_port) == (8080, 9901)
    assert t.listen_ports == {"gateway": 8100, "model": 8101, "feature": 8102, "cache": 8103}
    with pytest.raises(ValueError, match="Envoy's command"):
        build_specs(t, "redis://x:1")
    specs = {s.name: s for s in build_specs(t, "redis://x:1", envoy_command=["envoy", "-c", "x.yaml"])}
    assert specs["envoy"].argv == ["envoy", "-c", "x.yaml"]
    assert specs["envoy"].envoy_admin == "127.0.0.1:9901" and specs["envoy"].health_url is None
    assert "envoy" in specs["gateway"].depends_on and "gateway" not in specs["envoy"].depends_on
    gw = specs["gateway"].env
    assert gw["MESHSERVE_GATEWAY_MODEL_ADDRESS"] == "127.0.0.1:8101"
    assert gw["MESHSERVE_GATEWAY_FEATURE_ADDRESS"] == "127.0.0.1:8102"
    assert gw["MESHSERVE_GATEWAY_CACHE_ADDRESS"] == "127.0.0.1:8103"

    mesh = mesh_topology(t, StackSecrets.ensure(tmp_path / "logs"))
    assert mesh.ingress == "127.0.0.1:8080" and mesh.admin == "127.0.0.1:9901"
    model = mesh.services["model"]
    assert model.listen == "127.0.0.1:8101"
    assert [(r.address, r.labels["version"]) for r in model.replicas] == [
        ("127.0.0.1:8001", "v1"),
        ("127.0.0.1:8011", "v1"),
        ("127.0.0.1:8021", "v2"),
    ]
    assert mesh.services["gateway"].replicas[0].address == "127.0.0.1:8000"


def test_busy_ports_name_the_holder(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        t = StackLayout.local(0, gateway_port=port, models_dir=tmp_path, mesh=True)
        specs = build_specs(t, "redis://x:1", envoy_command=["envoy"])
        assert busy_ports(t, specs) == [f"gateway: port {port}"]


def test_redis_passwords_are_not_printed() -> None:
    from services.cli.stack.up import redact

    assert redact("redis://user:secret@h:6379/0") == "redis://user:***@h:6379/0"
    assert redact("rediss://:pw@h:1") == "rediss://:***@h:1"
    assert redact("redis://127.0.0.1:16381") == "redis://127.0.0.1:16381"


def test_free_port_layouts_never_repeat_a_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:

    offered = iter([40001, 40001, 40002, 40002, *range(40003, 40100)])  # the OS offering a released port again
    monkeypatch.setattr(port_module, "free_port", lambda host="127.0.0.1": next(offered))
    t = StackLayout.local(0, models_dir=tmp_path, mesh=True, traces=True)
    ports = [
        *(t.gateway_port, t.gateway_metrics_port, t.feature_port, t.feature_metrics_port, t.cache_port),
        *(t.cache_metrics_port, t.ingress_port, t.admin_port, t.traces_port, t.traces_ui_port),
        t.traces_recording_port,
        *t.listen_ports.values(),
        *(p for r in t.replicas for p in (r.port, r.metrics_port)),
        *(t.scaler_port, t.scaler_metrics_port),  # the demo's canary scales
    ]
    assert len(ports) == len(set(ports)) == 23
    assert sorted(port for _, port in t.ports()) == sorted(ports)  # what the clash check looks at


def test_a_layout_whose_ports_clash_is_refused(tmp_path: Path) -> None:
    crowded = StackTopology.model_validate(
        {"stable": {"subset": "v1", "replicas": 8}, "canary": {"subset": "v2", "replicas": 3}}
    )
    with pytest.raises(ValueError, match=r"port 8101: model-v2-c, envoy model"):
        StackLayout.local(8000, topology=crowded, models_dir=tmp_path, mesh=True)


def test_the_topology_names_and_places_the_replicas(tmp_path: Path) -> None:
    topology = StackTopology.model_validate(
        {
            "stable": {"subset": "blue", "replicas": 1, "pinned_versions": {"m": [3]}},
            "canary": {"subset": "green", "replicas": 2, "pinned_versions": {"m": [4]}},
        }
    )
    t = StackLayout.local(9000, topology=topology, models_dir=tmp_path)
    assert [(r.name, r.subset, r.port, r.pinned_versions) for r in t.replicas] == [
        ("model-blue-a", "blue", 9001, {"m": [3]}),
        ("model-green-a", "green", 9021, {"m": [4]}),
        ("model-green-b", "green", 9031, {"m": [4]}),
    ]
    specs = {s.name: s for s in build_specs(t, "redis://x:1")}
    assert specs["model-green-b"].role == "model green m:[4]"


def test_the_supervised_valkeys_have_fixed_ports_a_password_and_come_first(tmp_path: Path) -> None:
    """Two Valkeys: the feature store's (8004) and the cache's (8006), each service on its own."""
    t = StackLayout.local(8000, models_dir=tmp_path, valkey=True, log_dir=tmp_path / "logs", traces=True)
    assert t.valkey_port == 8004 and ("valkey", 8004) in t.ports()
    assert t.valkey_cache_port == 8006 and ("valkey-cache", 8006) in t.ports()
    secrets = StackSecrets.ensure(tmp_path / "logs")
    features, cache = "redis://:pw@127.0.0.1:8004/0", "redis://:pw@127.0.0.1:8006/0"
    specs = {s.name: s for s in build_specs(t, features, secrets=secrets, cache_redis_url=cache)}
    for name, port, folder in (("valkey", 8004, "valkey"), ("valkey-cache", 8006, "valkey-cache")):
        valkey = specs[name]
        assert valkey.argv[0].endswith("valkey-server")
        assert valkey.argv[1] == str(tmp_path / f"logs/{folder}/valkey.conf")
        assert (valkey.port, valkey.protocol, valkey.depends_on) == (port, "redis", [])
        assert valkey.password is not None and valkey.password.get_secret_value() == secrets.valkey_password()
        assert secrets.valkey_password() not in repr(valkey)  # a SecretStr: never in a log line or a traceback
    for name, url in (("feature", features), ("cache", cache)):
        assert set(specs[name].depends_on) == {"traces", "valkey", "valkey-cache"}
        assert specs[name].env["MESHSERVE_REDIS_URL"] == url
    assert "valkey" not in specs["model-v1-a"].depends_on
    with pytest.raises(ValueError, match="log dir"):
        build_specs(StackLayout.local(8000, models_dir=tmp_path, valkey=True), "redis://x:1")


def test_every_service_gets_the_operator_token_and_the_gateway_the_jwks(tmp_path: Path) -> None:
    secrets = StackSecrets.ensure(tmp_path / "logs")
    t = StackLayout.local(8000, models_dir=tmp_path)
    specs = {s.name: s for s in build_specs(t, "redis://x:1", secrets=secrets)}
    token = secrets.operator_token()
    for name, prefix in [("model-v1-a", "MODEL"), ("model-v2", "MODEL"), ("feature", "FEATURE"), ("cache", "CACHE")]:
        assert specs[name].env[f"MESHSERVE_{prefix}_ADMIN_TOKEN"] == token
    assert specs["gateway"].env["MESHSERVE_GATEWAY_ADMIN_TOKEN"] == token
    assert json.loads(specs["gateway"].env["MESHSERVE_GATEWAY_JWKS"]) == json.loads(secrets.jwks())
    plain = {s.name: s for s in build_specs(t, "redis://x:1")}
    assert not any("ADMIN_TOKEN" in k for s in plain.values() for k in s.env)


def test_gateway_replicas_have_their_own_ports_behind_the_mesh_gateway(tmp_path: Path) -> None:
    two = StackTopology.demo().with_counts(gateway_replicas=2)
    t = StackLayout.local(8000, models_dir=tmp_path, mesh=True, topology=two, insecure=True)
    assert [(g.name, g.port, g.metrics_port) for g in t.gateways] == [
        ("gateway-a", 8000, 9000),
        ("gateway-b", 8010, 9010),
    ]
    assert t.gateway_port == 8000
    specs = build_specs(t, "redis://x:1", envoy_command=["envoy"])
    names = [s.name for s in specs]
    assert names[-2:] == ["gateway-a", "gateway-b"]
    gateways = [s for s in specs if s.name.startswith("gateway")]
    assert [s.env["MESHSERVE_GATEWAY_PORT"] for s in gateways] == ["8000", "8010"]
    assert all(s.env["MESHSERVE_GATEWAY_MODEL_ADDRESS"] == "127.0.0.1:8101" for s in gateways)
    assert all("envoy" in s.depends_on and not {"gateway-a", "gateway-b"} & set(s.depends_on) for s in gateways)
    mesh = mesh_topology(t)
    assert [r.address for r in mesh.services["gateway"].replicas] == ["127.0.0.1:8000", "127.0.0.1:8010"]
    free = StackLayout.local(0, models_dir=tmp_path, topology=StackTopology.demo().with_counts(gateway_replicas=3))
    assert len({p for g in free.gateways for p in (g.port, g.metrics_port)}) == 6
    assert (
        StackTopology.demo().gateway.replicas == 1
        and StackLayout.local(8000, models_dir=tmp_path).gateways[0].name == "gateway"
    )


def test_envoy_admin_listens_on_a_socket_in_the_log_dir(tmp_path: Path) -> None:
    t = StackLayout.local(8000, models_dir=tmp_path, mesh=True, log_dir=tmp_path / "logs", admin_socket=True)
    socket_path = tmp_path.resolve() / "logs" / "mesh" / "admin.sock"
    assert t.admin_socket == socket_path and t.admin == f"unix:{socket_path}"
    assert "envoy admin" not in dict(t.ports())
    specs = {s.name: s for s in build_specs(t, "redis://x:1", envoy_command=["envoy"])}
    assert specs["envoy"].envoy_admin == f"unix:{socket_path}"
    assert mesh_topology(t, StackSecrets.ensure(tmp_path / "logs")).admin == f"unix:{socket_path}"
    deep = tmp_path / ("d" * 90)
    with pytest.raises(ValueError, match="shorter --log-dir"):
        StackLayout.local(8000, models_dir=tmp_path, mesh=True, log_dir=deep, admin_socket=True)


def test_the_secure_ingress_gets_the_certificate_and_the_jwks_the_insecure_one_neither(tmp_path: Path) -> None:
    secrets = StackSecrets.ensure(tmp_path / "logs")
    secure = mesh_topology(StackLayout.local(8000, models_dir=tmp_path, mesh=True), secrets)
    assert secure.authenticate and secure.ingress_tls is not None
    assert (secure.ingress_tls.cert_chain, secure.ingress_tls.private_key) == (
        secrets.ingress_cert,
        secrets.ingress_key,
    )
    assert secure.jwks == {LOCAL_ISSUER: secrets.jwks()}
    with pytest.raises(ValueError, match="secrets"):
        mesh_topology(StackLayout.local(8000, models_dir=tmp_path, mesh=True))
    insecure = mesh_topology(StackLayout.local(8000, models_dir=tmp_path, mesh=True, insecure=True))
    assert not insecure.authenticate and insecure.ingress_tls is None and insecure.jwks == {}


def test_the_demo_layout_keeps_its_ports_and_adds_the_scaler(tmp_path: Path) -> None:
    t = StackLayout.local(8000, models_dir=tmp_path, mesh=True)
    assert [(r.name, r.port, r.metrics_port, r.initial) for r in t.replicas] == [
        ("model-v1-a", 8001, 9001, True),
        ("model-v1-b", 8011, 9011, True),
        ("model-v2", 8021, 9021, True),
    ]
    assert (t.scaler_port, t.scaler_metrics_port) == (8005, 9005)
    specs = {s.name: s for s in build_specs(t, "redis://x:1", envoy_command=["envoy"])}
    assert specs["scaler"].argv[1:] == ["-m", "services.scaler"] and specs["scaler"].port == 8005
    assert specs["scaler"].env["MESHSERVE_SCALER_PORT"] == "8005"
    assert specs["gateway"].env["MESHSERVE_GATEWAY_SCALER_ADDRESS"] == "127.0.0.1:8005"
    assert "scaler" in specs["gateway"].depends_on
    fixed = StackLayout.local(8000, models_dir=tmp_path, topology=StackTopology.demo().with_counts(canary=False))
    assert fixed.scaler_port is None and fixed.autoscaled == []
    gateway = {s.name: s for s in build_specs(fixed, "redis://x:1")}["gateway"]
    assert "MESHSERVE_GATEWAY_SCALER_ADDRESS" not in gateway.env and "scaler" not in gateway.depends_on


def test_a_group_has_a_slot_for_every_replica_it_may_run(tmp_path: Path) -> None:
    topology = tmp_path / "stack.yaml"
    topology.write_text(
        "stable: {subset: v1, replicas: 1, min_replicas: 1, max_replicas: 3, pinned_versions: {fraud_mlp: [1]}}\n"
        "canary: {subset: v2, replicas: 0, min_replicas: 0, max_replicas: 2, pinned_versions: {fraud_mlp: [2]}}\n"
    )
    t = StackLayout.local(8000, models_dir=tmp_path, mesh=True, topology=StackTopology.load(topology))
    assert [(r.name, r.port, r.metrics_port, r.slot, r.initial) for r in t.replicas] == [
        ("model-v1-a", 8001, 9001, 0, True),
        ("model-v1-b", 8011, 9011, 1, False),
        ("model-v1-c", 8021, 9021, 2, False),
        ("model-v2-a", 8031, 9031, 0, False),
        ("model-v2-b", 8041, 9041, 1, False),
    ]
    assert [r.name for r in t.initial_replicas] == ["model-v1-a"] and [r.name for r in t.slots("v2")] == [
        "model-v2-a",
        "model-v2-b",
    ]
    specs = build_specs(t, "redis://x:1", envoy_command=["envoy"])
    assert [s.name for s in specs if s.name.startswith("model")] == ["model-v1-a"]
    assert all(s.env["MESHSERVE_MODEL_TORCH_THREADS"] == "1" for s in specs if s.name.startswith("model"))
    assert ("model-v2-b", 8041) in t.ports()  # the clash check covers the slots not started


def test_the_mesh_model_service_is_dynamic_when_a_group_scales(tmp_path: Path) -> None:
    secrets = StackSecrets.ensure(tmp_path / "logs")
    elastic = StackLayout.local(8000, models_dir=tmp_path, mesh=True, topology=StackTopology.elastic())
    mesh = mesh_topology(elastic, secrets)
    assert mesh.services["model"].dynamic and mesh.services["model"].replicas == []  # starts at zero
    assert not mesh.services["gateway"].dynamic and not mesh.services["feature"].dynamic
    fixed = StackLayout.local(8000, models_dir=tmp_path, mesh=True, topology=StackTopology.demo().with_counts(2, False))
    assert not mesh_topology(fixed, secrets).services["model"].dynamic


def test_busy_ports_include_the_slots_a_group_may_start_later(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        t = StackLayout.local(port - 21, models_dir=tmp_path, mesh=True, topology=StackTopology.elastic())
        assert not t.replicas[2].initial and t.replicas[2].port == port
        busy = busy_ports(t, build_specs(t, "redis://x:1", envoy_command=["envoy"]))
        assert f"model-v1-c: port {port}" in busy


def test_free_ports_lie_below_the_ephemeral_range_and_never_repeat() -> None:
    """A free port is one bind(0) or an outgoing connection cannot be handed next; 200 of them are all distinct."""
    floor = port_module.ephemeral_floor()
    ports = [port_module.free_port() for _ in range(200)]
    assert len(set(ports)) == 200
    assert all(port_module.LOWEST_FREE_PORT <= p < floor for p in ports)
    with socket.socket() as held:
        held.bind(("127.0.0.1", ports[0]))
        assert port_module.port_in_use("127.0.0.1", ports[0])


def test_the_stack_writes_a_persistent_noeviction_store_and_an_evicting_cache(tmp_path: Path) -> None:
    """`meshserve up`'s two Valkey configs: the feature store keeps an append-only file in its own folder and never
    evicts; the cache keeps nothing and evicts the least recently used keys. Each service gets its own URL."""
    from services.cli.stack.up import stack_redis_url

    t = StackLayout.local(8000, models_dir=tmp_path, valkey=True, log_dir=tmp_path / "logs")
    secrets = StackSecrets.ensure(tmp_path / "logs")
    features, cache = stack_redis_url(t, secrets, None), stack_redis_url(t, secrets, None, cache=True)
    assert features.endswith("@127.0.0.1:8004/0") and cache.endswith("@127.0.0.1:8006/0")
    store, lru = t.valkey_config.read_text().splitlines(), t.valkey_cache_config.read_text().splitlines()
    assert {
        "appendonly yes",
        "appendfsync always",
        "maxmemory-policy noeviction",
        f"dir {t.valkey_config.parent}",
    } <= set(store)
    assert {"appendonly no", "maxmemory-policy allkeys-lru", f"dir {t.valkey_cache_config.parent}"} <= set(lru)
    assert t.valkey_config.parent != t.valkey_cache_config.parent
    external = StackLayout.local(8000, models_dir=tmp_path)
    assert stack_redis_url(external, secrets, "redis://r:1", cache=True) == "redis://r:1"  # one Redis for both
