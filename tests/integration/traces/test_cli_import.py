"""`meshserve traces` stays cheap to load: importing its typer app in a fresh interpreter pulls in no gRPC, no
generated stubs and no service runtime (the CLI imports it on every start)."""

from __future__ import annotations

import subprocess
import sys


def test_import_is_inert() -> None:
    code = (
        "import sys; from services.traces.cli import app; "
        "bad = [m for m in sys.modules if m.startswith(('services.protos', 'grpc', 'services.common'))]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
