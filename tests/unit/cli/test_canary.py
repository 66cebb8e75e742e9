"""`meshserve canary` argument parsing and its error without a running mesh."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.cli.canary import CanaryError, change, parse_weights


def test_parse_weights() -> None:
    assert parse_weights("v1=90,v2=10") == {"v1": 90, "v2": 10}
    assert parse_weights(" v2 = 100 ") == {"v2": 100}
    for bad in ("", "v1", "v1=x", "=5", "v1=-1"):
        with pytest.raises(CanaryError):
            parse_weights(bad)


def test_no_running_mesh_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CanaryError, match="meshserve up"):
        change(tmp_path)
