"""Each service's environment comes from its settings class: `ServiceSettings.env_for` checks names and values at
once, writes what the class reads back, and a renamed field breaks `build_specs`, not the started process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import Field
from pydantic_settings import SettingsConfigDict

import services.cli.stack.specs as specs
from services.cache.settings import CacheSettings
from services.cli.stack.layout import StackLayout
from services.common.recording.settings import RecordingSettings
from services.common.settings import ServiceSettings
from services.feature.settings import FeatureSettings
from services.gateway.settings import GatewaySettings
from services.model.settings import ModelSettings
from services.traces.settings import TracesSettings

ROUND_TRIPS: list[tuple[type[ServiceSettings], dict[str, Any]]] = [
    (
        ModelSettings,
        {
            "host": "127.0.0.2",
            "port": 18001,
            "grace_period_s": 2.5,
            "repository": Path("/srv/models"),
            "pinned_versions": {"fraud_mlp": [1, 3]},
            "models": ["fraud_mlp"],
            "watch": False,
            "torch_threads": 2,
            "max_concurrent_rpcs": 8,
        },
    ),
    (
        GatewaySettings,
        {
            "model_address": "127.0.0.1:18101",
            "feature_address": "127.0.0.1:18102",
            "cache_address": "127.0.0.1:18103",
            "pipelines_dir": Path("/srv/pipelines"),
            "metrics_port": 0,
        },
    ),
    (CacheSettings, {"redis_url": "redis://u:p@h:1/0", "port": 18003, "key_prefix": "t:"}),
    (FeatureSettings, {"redis_url": "redis://h:2", "features_dir": Path("/srv/features")}),
    (TracesSettings, {"host": "127.0.0.1", "port": 14317, "db": Path("/tmp/t.sqlite")}),
]


@pytest.mark.parametrize(("settings", "fields"), ROUND_TRIPS, ids=lambda v: getattr(v, "__name__", ""))
def test_env_for_round_trips(
    settings: type[ServiceSettings], fields: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = settings.env_for(**fields)
    assert len(env) == len(fields)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    read = settings()
    assert {name: getattr(read, name) for name in fields} == fields


def test_env_for_uses_the_class_prefix_aliases_and_json_for_complex_fields() -> None:
    assert ModelSettings.env_for(port=1, pinned_versions={"m": [2]}, watch=True) == {
        "MESHSERVE_MODEL_PORT": "1",
        "MESHSERVE_MODEL_PINNED_VERSIONS": '{"m": [2]}',
        "MESHSERVE_MODEL_WATCH": "true",
    }
    assert CacheSettings.env_for(redis_url="redis://h:1") == {"MESHSERVE_REDIS_URL": "redis://h:1"}  # shared alias
    assert GatewaySettings.env_name("model_address") == "MESHSERVE_GATEWAY_MODEL_ADDRESS"
    assert ModelSettings.env_for(max_concurrent_rpcs=None) == {}  # None: left unset, the default


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"pinned_version": {"m": [1]}}, "ModelSettings has no field 'pinned_version'"),
        ({"port": "eighty"}, r"ModelSettings: port: Input should be a valid integer"),
        ({"port": 70000}, r"port: Input should be less than or equal to 65535"),
        ({"pinned_versions": {"m": ["one"]}}, r"pinned_versions\.m\.0: Input should be a valid integer"),
        ({"repository": None}, "repository: Input is not a valid path"),
    ],
)
def test_env_for_refuses_unknown_fields_and_bad_values(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelSettings.env_for(**fields)


class CappedSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="MESHSERVE_CAPPED_")

    cap: int | None = Field(5)


def test_a_none_the_environment_cannot_spell_is_refused() -> None:
    with pytest.raises(ValueError, match=r"CappedSettings\.cap: None cannot be set from the environment"):
        CappedSettings.env_for(cap=None)
    assert CappedSettings.env_for(cap=7) == {"MESHSERVE_CAPPED_CAP": "7"}


class RenamedGatewaySettings(ServiceSettings):
    """The gateway's settings after a rename of `model_address` (what the CLI must notice before starting)."""

    model_config = SettingsConfigDict(env_prefix="MESHSERVE_GATEWAY_", extra="ignore", frozen=True)

    pipelines_dir: Path = Field(Path("pipelines"))
    model_target: str = Field("127.0.0.1:8001")
    feature_address: str = Field("127.0.0.1:8002")
    cache_address: str = Field("127.0.0.1:8003")


def test_a_renamed_settings_field_fails_when_the_specs_are_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = StackLayout.local(0, models_dir=tmp_path)
    assert specs.build_specs(layout, "redis://x:1")  # as the services are today
    monkeypatch.setitem(specs.SETTINGS, "gateway", RenamedGatewaySettings)
    with pytest.raises(ValueError, match="RenamedGatewaySettings has no field 'model_address'"):
        specs.build_specs(layout, "redis://x:1")


def test_every_service_spec_is_built_from_its_settings_class(tmp_path: Path) -> None:
    layout = StackLayout.local(0, models_dir=tmp_path, traces=True, traces_db=tmp_path / "t.sqlite")
    built = specs.build_specs(layout, "redis://x:1")
    by_service = {s.argv[2].removeprefix("services."): s for s in built}
    classes = {**specs.SETTINGS, "traces": TracesSettings}
    assert set(by_service) == set(classes)
    for service, spec in by_service.items():
        ours = {k for k in spec.env if k.startswith("MESHSERVE_")}
        known = {classes[service].env_name(name) for name in classes[service].model_fields}
        if service != "traces":  # every service records: the stack's retroactive tracing settings
            known |= {RecordingSettings.env_name(name) for name in RecordingSettings.model_fields}
        assert ours and ours <= known, (service, ours - known)


def test_every_service_of_the_stack_records_and_knows_every_recording_process_as_a_peer(tmp_path: Path) -> None:
    layout = StackLayout.local(0, models_dir=tmp_path, traces=True, traces_db=tmp_path / "t.sqlite")
    built = [s for s in specs.build_specs(layout, "redis://x:1") if s.metrics_port]
    scaler = next(s for s in built if s.name == "scaler")  # the demo's canary scales; the scaler serves no request
    assert not [k for k in scaler.env if k.startswith(("MESHSERVE_TRACING_", "OTEL_"))]
    built.remove(scaler)
    admin = {f"127.0.0.1:{s.metrics_port}" for s in built if s.name != "traces"}
    admin.add(f"127.0.0.1:{layout.traces_recording_port}")  # Envoy's access log records, at the trace store
    assert {s.name for s in built} >= {"gateway", "feature", "cache", "model-v1-a", "model-v1-b", "model-v2"}
    for spec in built:
        if spec.name == "traces":
            continue
        with pytest.MonkeyPatch.context() as env:  # the settings the started process reads
            for key, value in spec.env.items():
                env.setenv(key, value)
            settings = RecordingSettings()
        assert settings.retroactive, spec.name
        assert set(settings.all_peers()) == admin, spec.name


def test_head_mode_leaves_the_recording_settings_out(tmp_path: Path) -> None:
    layout = StackLayout.local(0, models_dir=tmp_path, traces=True, tracing_mode="head")
    for spec in specs.build_specs(layout, "redis://x:1"):
        assert not [k for k in spec.env if k.startswith("MESHSERVE_TRACING_")], spec.name
