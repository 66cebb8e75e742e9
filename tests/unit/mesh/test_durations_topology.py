"""Go duration strings and the topology file."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.mesh.durations import envoy_duration, parse_duration
from services.mesh.errors import MeshConfigError
from services.mesh.topology import MeshTopology


@pytest.mark.parametrize(
    ("text", "seconds"), [("5s", 5), ("250ms", 0.25), ("1m30s", 90), ("1h", 3600), ("1.5s", 1.5), ("100us", 1e-4)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "ten seconds", "5s junk", "s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_envoy_duration() -> None:
    assert envoy_duration(5) == "5s"
    assert envoy_duration(0.25) == "0.25s"
    assert envoy_duration(0) == "0s"


def test_topology_file(tmp_path: Path) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text(
        "services:\n  model:\n    listen: 127.0.0.1:18001\n    replicas:\n"
        "      - {address: 127.0.0.1:28001, labels: {version: v2}}\n      - {address: 127.0.0.1:28002}\n"
    )
    topology = MeshTopology.load(path)
    assert [r.labels for r in topology.services["model"].replicas] == [{"version": "v2"}, {"version": "v1"}]
    assert topology.ingress == "127.0.0.1:8080" and topology.admin == "127.0.0.1:9901" and topology.otlp is None


def test_topology_errors_name_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text("services:\n  model:\n    listen: nowhere\n")
    with pytest.raises(MeshConfigError, match=r"topology\.yaml: topology: services\.model\.listen"):
        MeshTopology.load(path)
    path.write_text("services: {}\nadmn: 127.0.0.1:1\n")
    with pytest.raises(MeshConfigError, match="admn: unknown field"):
        MeshTopology.load(path)


def test_admin_address_is_host_port_or_an_absolute_unix_socket() -> None:
    services = {"model": {"listen": "127.0.0.1:18001"}}
    assert MeshTopology.model_validate({"services": services, "admin": "unix:/run/a.sock"}).admin == "unix:/run/a.sock"
    for bad in ("unix:relative.sock", "unix:/" + "x" * 120, "nowhere"):
        with pytest.raises(ValueError, match="admin"):
            MeshTopology.model_validate({"services": services, "admin": bad})


def test_secure_ingress_fields_and_their_defaults(tmp_path: Path) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text(
        "services: {}\ningress_tls: {cert_chain: /s/ingress.pem, private_key: /s/ingress-key.pem}\n"
        "jwks: {'https://meshserve.local': '{\"keys\": []}'}\nauthenticate: false\n"
    )
    topology = MeshTopology.load(path)
    assert topology.ingress_tls is not None and topology.ingress_tls.cert_chain == Path("/s/ingress.pem")
    assert topology.jwks == {"https://meshserve.local": '{"keys": []}'} and topology.authenticate is False
    default = MeshTopology(services={})
    assert default.ingress_tls is None and default.jwks == {} and default.authenticate is True
