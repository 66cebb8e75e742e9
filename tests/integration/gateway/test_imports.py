"""The gateway's image carries neither Redis nor torch: importing its entry point in a clean interpreter pulls
in neither, and of the feature and model services only their public surfaces (api, and the client and domain
types behind it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
PROBE = """
import json, sys
import services.gateway.__main__
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("redis", "torch", "services"))))
"""


def loaded_modules() -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_gateway_leaves_redis_and_torch_out() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, services.gateway.__main__; print('redis' in sys.modules, 'torch' in sys.modules)",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.split() == ["False", "False"], done.stderr


def test_the_gateway_uses_other_services_only_through_their_api_modules() -> None:
    modules = loaded_modules()
    assert not [m for m in modules if m.split(".")[0] in ("redis", "torch")]
    feature_and_model = {m for m in modules if m.startswith(("services.feature", "services.model"))}
    surfaces = {f"services.{s}{room}" for s in ("feature", "model") for room in ("", ".api", ".client", ".domain")}
    assert feature_and_model <= surfaces, sorted(feature_and_model - surfaces)
    assert "services.cache.api" in modules
    assert not {"services.cache.handler", "services.cache.redis_tier", "services.cache.servicer"} & set(modules)
